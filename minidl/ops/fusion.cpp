#include "minidl/ops/fusion.hpp"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "minidl/core/log.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/native/gemm_bf16.hpp"
#include "minidl/ops/nn/window.hpp"
#include "minidl/ops/ops.hpp"

namespace minidl::ops {
namespace {

bool declares_attr(const ir::OpDef& d, std::string_view name) {
  const auto& attrs = d.attr_decls();
  return std::any_of(attrs.begin(), attrs.end(),
                     [&](const ir::AttrDecl& a) { return a.name == name; });
}

// Whether n's next input, after those it has, would be its op's optional input `name`.
bool next_input_is(const ir::Node& n, std::string_view name) {
  const ir::OpDef& d = n.def();
  const auto& names = d.input_names();
  const std::size_t next = n.inputs().size();
  return next < names.size() && names[next] == name && static_cast<int>(next) >= d.min_inputs();
}

// Whether a following bias_add can become n's input "bias".
bool takes_bias(const ir::Node& n) { return next_input_is(n, "bias"); }

// Whether n has an "activation" attribute, still none.
bool activation_none(const ir::Node& n) {
  return declares_attr(n.def(), "activation") && n.attrs().get<std::string>("activation") == "none";
}

// Whether the op's declared inputs end with "y": a backward op whose activation masks its dy by
// the activation's output y rather than applying to its own output.
bool masks_by_y(const ir::OpDef& d) {
  return !d.input_names().empty() && d.input_names().back() == "y";
}

// Whether a following relu can become n's activation. A max pooling's argmax then marks the
// outputs the relu clamps (pool::kClamped), which only its own backward may read.
bool takes_activation(const ir::Graph& g, const ir::Node& n) {
  if (!activation_none(n) || masks_by_y(n.def())) return false;
  if (n.op() != "max_pool2d") return true;
  const ir::Value* argmax = n.output(1);
  return std::find(g.outputs().begin(), g.outputs().end(), argmax) == g.outputs().end() &&
         std::all_of(argmax->users().begin(), argmax->users().end(),
                     [](const ir::Node* u) { return u->op() == "max_pool2d_bwd"; });
}

// Whether n, a reader of relu_bwd's result, can mask its dy itself (its last input "y").
bool takes_mask(const ir::Node& n) { return activation_none(n) && next_input_is(n, "y"); }

// Whether n is a max_pool2d_bwd whose argmax, from the max_pool2d with a fused relu that made y,
// masks its dy already.
bool masks_by_argmax(const ir::Node& n, const ir::Value* y) {
  return n.op() == "max_pool2d_bwd" && argmax_masks_relu(n.input(1)) &&
         n.input(1)->producer()->output(0) == y;
}

// Why no kernel of a fused node's op takes it (each kernel's refusal), or "" when one does. The
// fused ops have native kernels only, so the preferred backend changes nothing.
std::string no_kernel_takes(const ir::Node& fused) {
  const ir::KernelChoice c = ir::choose_kernel(fused, ir::Backend::Native);
  return c.kernel != nullptr ? "" : c.declined.substr(2);
}

// Whether v is read only by its one user inside the graph: a graph output has an outside reader.
bool read_once(const ir::Graph& g, const ir::Value* v) {
  return v->users().size() == 1 &&
         std::find(g.outputs().begin(), g.outputs().end(), v) == g.outputs().end();
}

// The single reader of v when it runs op `op` with v as input 0, else null.
ir::Node* sole_reader(const ir::Graph& g, ir::Value* v, std::string_view op) {
  if (!read_once(g, v)) return nullptr;
  ir::Node* u = v->users()[0];
  return u->op() == op && u->input(0) == v ? u : nullptr;
}

}  // namespace

bool FuseBiasActivation::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* producer;
    ir::Node* bias_add;  // or null
    ir::Node* relu;      // or null
  };
  std::vector<Match> matches;
  for (ir::Node* n : g.nodes()) {
    Match m{n, nullptr, nullptr};
    // A bias only where n has one output: the fused node then takes the bias_add's place, which
    // readers of another output (between n and the bias_add) could not see.
    if (n->outputs().size() == 1 && takes_bias(*n))
      m.bias_add = sole_reader(g, n->output(0), "bias_add");
    if (takes_activation(g, *n))
      m.relu = sole_reader(g, m.bias_add ? m.bias_add->output(0) : n->output(0), "relu");
    if (m.bias_add || m.relu) matches.push_back(m);
  }
  for (const Match& m : matches) {
    std::vector<ir::Value*> inputs = m.producer->inputs();
    ir::Attrs attrs = m.producer->attrs();
    std::string absorbed;
    if (m.bias_add) {
      inputs.push_back(m.bias_add->input(1));
      absorbed = m.bias_add->name();
    }
    if (m.relu) {
      attrs.set("activation", std::string("relu"));
      absorbed += (absorbed.empty() ? "" : ", ") + m.relu->name();
    }
    ir::Node* last = m.relu ? m.relu : m.bias_add;
    const std::string name = m.producer->name();
    ir::Node* fused = g.add_node(m.producer->def(), std::move(inputs), std::move(attrs),
                                 name + "+" + (m.bias_add ? "bias" : "") +
                                     (m.bias_add && m.relu ? "+" : "") + (m.relu ? "relu" : ""));
    fused->take_marks(*m.producer);
    fused->annotations().set("fused", absorbed);
    // Every input is defined before `last` (the bias before the bias_add), and every reader of
    // the result comes after it: the fused node takes its place. Without a bias its inputs are
    // the producer's, and it takes the producer's place, where the readers of the producer's
    // other outputs (max pooling's argmax) find them too.
    g.move_before(fused, m.bias_add ? last : m.producer);
    g.replace_uses(last->output(0), fused->output(0));
    for (std::size_t o = 1; o < m.producer->outputs().size(); ++o)
      g.replace_uses(m.producer->output(static_cast<int>(o)), fused->output(static_cast<int>(o)));
    std::vector<ir::Node*> dead{m.producer};
    if (m.bias_add) dead.push_back(m.bias_add);
    if (m.relu) dead.push_back(m.relu);
    g.remove(dead);
  }
  return !matches.empty();
}

std::string bf16_momentum_refusal(const ir::Node& n) {
  if (ir::node_precision(n) != ir::Precision::BF16)
    return "computes in bf16 only (nodes marked precision=bf16)";
  for (const ir::Value* v : {n.input(0), n.input(1)})
    if (!v->layout().empty()) return fmt::format("takes {} plain only", v->ref());
  const bool tb = n.attrs().get<bool>("trans_b");
  const Shape& b = n.input(1)->shape();
  return native::tn_bf16_refusal(n.attrs().get<bool>("trans_a"), tb, tb ? b[0] : b[1]);
}

bool FuseUpdateIntoProduct::run(ir::Graph& g) {
  if (!enabled_) return false;
  std::vector<std::pair<ir::Node*, ir::Node*>> matches;  // (matmul, update)
  for (ir::Node* n : g.nodes()) {
    // sgd without weight decay, or sgd_momentum; neither with a clipping factor (grad_scale).
    const bool plain = n->op() == "sgd" && n->inputs().size() == 3 &&
                       n->attrs().get<float>("weight_decay") == 0.0f;
    const bool momentum = n->op() == "sgd_momentum" && n->inputs().size() == 4;
    if (!plain && !momentum) continue;
    ir::Value* grad = n->input(1);
    ir::Node* mm = grad->producer();
    if (mm->op() != "matmul" || mm->inputs().size() != 2 ||
        mm->attrs().get<std::string>("activation") != "none" || !read_once(g, grad))
      continue;
    // A product marked bf16 folds only where the fused op's bf16 kernel takes it; elsewhere it
    // stays a bf16 product, its update apart: the f32 fused kernel's multiplications cost more
    // than the update's extra pass over the gradient. The CIFAR CNN's fc1 under --precision bf16
    // on an AMD EPYC with AVX512-BF16: oneDNN's bf16 product 91 us and the update 152 us against
    // 270 us fused in f32, 238-282 + 147-159 us against 583-621 us in a slower hour (--profile).
    const bool bf16 = ir::node_precision(*mm) == ir::Precision::BF16;
    if (bf16 && (!momentum || !bf16_momentum_refusal(*mm).empty())) continue;
    const ir::Value* a = mm->input(0);
    const ir::Value* b = mm->input(1);
    if (!bf16 && (a->stored() != DType::F32 || b->stored() != DType::F32)) continue;
    // The GEMM writes the parameter (and velocity) while it reads its operands: never one of
    // them.
    const ir::Value* velocity = momentum ? n->input(2) : nullptr;
    if (a == n->input(0) || b == n->input(0) || a == velocity || b == velocity) continue;
    matches.emplace_back(mm, n);
  }
  for (const auto& [mm, update] : matches) {
    ir::Value* a = mm->input(0);
    ir::Value* b = mm->input(1);
    const bool ta = mm->attrs().get<bool>("trans_a"), tb = mm->attrs().get<bool>("trans_b");
    ir::Node* fused = nullptr;
    if (update->op() == "sgd") {
      fused = g.add_node(ops::op("matmul_accumulate"), {a, b, update->input(0), update->input(2)},
                         {{"trans_a", ta}, {"trans_b", tb}, {"alpha", -1.0f}, {"beta", 1.0f}},
                         mm->name() + "+sgd");
    } else {
      const ir::Attrs& u = update->attrs();
      fused = g.add_node(ops::op("matmul_sgd_momentum"),
                         {a, b, update->input(0), update->input(2), update->input(3)},
                         {{"trans_a", ta},
                          {"trans_b", tb},
                          {"momentum", u.get<float>("momentum")},
                          {"weight_decay", u.get<float>("weight_decay")},
                          {"nesterov", u.get<bool>("nesterov")}},
                         mm->name() + "+sgd");
    }
    fused->take_marks(*update);
    fused->annotations().set("fused", update->name());
    if (ir::node_precision(*mm) == ir::Precision::BF16)
      fused->annotations().set("precision", std::string(ir::precision_name(ir::Precision::BF16)));
    // The product's operands are defined before the matmul, and every reader of the parameter's
    // old value runs before the update: the fused node takes the update's place.
    g.move_before(fused, update);
    for (std::size_t o = 0; o < update->outputs().size(); ++o)
      g.replace_uses(update->output(static_cast<int>(o)), fused->output(static_cast<int>(o)));
    g.remove({update, mm});
  }
  return !matches.empty();
}

bool FuseResidualIntoBatchNorm::run(ir::Graph& g) {
  if (!enabled_) return false;
  auto f32 = [](const ir::Value* v) {
    return v->dtype() == DType::F32 && v->stored() == DType::F32;
  };
  std::vector<std::pair<ir::Node*, int>> matches;  // (add, the operand a batch_norm makes)
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "add" || n->inputs().size() != 2) continue;
    const ir::Value* a = n->input(0);
    const ir::Value* b = n->input(1);
    if (a->shape() != b->shape() || a->shape() != n->output()->shape() || !f32(a) || !f32(b) ||
        !f32(n->output()))
      continue;
    for (int k = 0; k < 2; ++k) {
      const ir::Node* bn = n->input(k)->producer();
      if (bn->op() == "batch_norm" && bn->inputs().size() == 5 && activation_none(*bn) &&
          read_once(g, n->input(k)) && n->input(1 - k) != n->input(k)) {
        matches.emplace_back(n, k);
        break;
      }
    }
  }
  for (const auto& [add, k] : matches) {
    ir::Node* bn = add->input(k)->producer();
    std::vector<ir::Value*> inputs = bn->inputs();
    inputs.push_back(add->input(1 - k));
    ir::Attrs attrs = bn->attrs();
    const std::string activation = add->attrs().get<std::string>("activation");
    attrs.set("activation", activation);
    ir::Node* fused = g.add_node(bn->def(), std::move(inputs), std::move(attrs),
                                 bn->name() + "+add" + (activation == "relu" ? "+relu" : ""));
    fused->take_marks(*bn);
    fused->annotations().set("fused", add->name());
    // The shortcut and the batch_norm's inputs are defined before the add, and its readers come
    // after it.
    g.move_before(fused, add);
    g.replace_uses(add->output(0), fused->output(0));
    g.remove({add, bn});
  }
  return !matches.empty();
}

bool FuseBatchNormBackward::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* add;
    ir::Node* bwd;    // batch_norm_bwd
    ir::Node* stats;  // bn_stats_bwd
  };
  std::vector<Match> matches;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "add" || n->inputs().size() != 2) continue;
    for (int i = 0; i < 2; ++i) {
      ir::Value* a = n->input(i);
      ir::Value* b = n->input(1 - i);
      if (a == b || a->producer()->op() != "batch_norm_bwd" || a != a->producer()->output(0) ||
          b->producer()->op() != "bn_stats_bwd" || !read_once(g, a) || !read_once(g, b))
        continue;
      ir::Node* bwd = a->producer();
      ir::Node* stats = b->producer();
      if (bwd->input(1) != stats->input(0) || n->output(0)->shape() != a->shape()) continue;
      matches.push_back({n, bwd, stats});
      break;
    }
  }
  for (const Match& m : matches) {
    const ir::Attrs attrs{{"eps", double{m.bwd->attrs().get<float>("eps")}}};
    const auto& in = m.bwd->inputs();  // dy, x, mean, var, weight?
    ir::Node* reduce = g.add_node(op("batch_norm_bwd_reduce"), in, attrs, m.bwd->name());
    reduce->take_marks(*m.bwd);
    std::vector<ir::Value*> data_in{in[0], in[1], in[3], m.stats->input(1)};
    if (in.size() > 4) data_in.push_back(in[4]);
    ir::Node* data = g.add_node(op("batch_norm_bwd_data"), std::move(data_in), attrs,
                                m.bwd->name() + "+bn_stats_bwd");
    data->take_marks(*m.add);
    data->annotations().set("fused", m.stats->name() + ", " + m.add->name());
    // The reduction's inputs are defined before batch_norm_bwd, whose readers come after it; the
    // data node's inputs (dstats included) before the add, whose readers come after it.
    g.move_before(reduce, m.bwd);
    for (int o = 0; o < 4; ++o) g.replace_uses(m.bwd->output(o + 1), reduce->output(o));
    g.move_before(data, m.add);
    g.replace_uses(m.add->output(0), data->output(0));
    g.remove({m.add, m.stats, m.bwd});
  }
  return !matches.empty();
}

bool FuseBiasIntoWeightGradient::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* bias;     // bias_add_bwd
    ir::Node* weights;  // conv2d_bwd_weights
    ir::Node* first;    // the earlier of the two: the fused node's place
  };
  std::unordered_map<const ir::Node*, std::size_t> pos;
  for (const ir::Node* n : g.nodes()) pos.emplace(n, pos.size());
  std::vector<Match> matches;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "bias_add_bwd") continue;
    ir::Value* dy = n->input(0);
    const auto& users = dy->users();
    auto w = std::find_if(users.begin(), users.end(), [&](const ir::Node* u) {
      return u->op() == "conv2d_bwd_weights" && u->input(0) == dy;
    });
    if (w == users.end()) continue;
    ir::Node* first = pos.at(n) < pos.at(*w) ? n : *w;
    // Both inputs must exist where the fused node goes (x is a forward value in autograd's
    // graphs; a hand-built graph may define it between the two).
    if (pos.at((*w)->input(1)->producer()) >= pos.at(first)) continue;
    // One fused node per weight gradient, should two bias_add_bwd read its dy.
    if (std::any_of(matches.begin(), matches.end(),
                    [&](const Match& m) { return m.weights == *w; }))
      continue;
    matches.push_back({n, *w, first});
  }
  for (const Match& m : matches) {
    ir::Node* fused = g.add_node(op("conv2d_bwd_weights_bias"), m.weights->inputs(),
                                 m.weights->attrs(), m.weights->name() + "+bias");
    fused->take_marks(*m.weights);
    fused->annotations().set("fused", m.bias->name());
    g.move_before(fused, m.first);
    g.replace_uses(m.weights->output(0), fused->output(0));
    g.replace_uses(m.bias->output(0), fused->output(1));
    g.remove({m.bias, m.weights});
  }
  return !matches.empty();
}

bool FusePoolBackwardIntoWeightGradient::run(ir::Graph& g) {
  if (!enabled_) return false;
  std::vector<std::pair<ir::Node*, ir::Node*>> pairs;  // (pooling's backward, weight gradient)
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "max_pool2d_bwd") continue;
    const auto& users = n->output()->users();
    if (users.size() != 1) continue;
    ir::Node* w = users.front();
    if (w->op() != "conv2d_bwd_weights_bias" || w->input(0) != n->output() ||
        w->input(1) == n->output() || w->replica() != n->replica())
      continue;
    pairs.emplace_back(n, w);
  }
  bool changed = false;
  for (const auto& [pool, w] : pairs) {
    ir::Attrs attrs = w->attrs();
    attrs.set("pool_kernel", pool->attrs().get<ir::Ints>("kernel"));
    attrs.set("pool_stride", pool_stride(pool->attrs()));
    attrs.set("pool_pad", pool->attrs().get<ir::Ints>("pad"));
    ir::Node* fused = g.add_node(op("conv2d_bwd_weights_bias_pooled"),
                                 {pool->input(0), pool->input(1), w->input(1)}, std::move(attrs),
                                 w->name() + "+pool");
    fused->take_marks(*w);
    if (const std::string why = no_kernel_takes(*fused); !why.empty()) {
      log_verbose("dispatch", "{} stays apart from {}: {}", pool->describe(), w->describe(), why);
      g.remove({fused});
      continue;
    }
    fused->annotations().set("fused", pool->name());
    g.move_before(fused, w);
    g.replace_uses(w->output(0), fused->output(0));
    g.replace_uses(w->output(1), fused->output(1));
    g.remove({w, pool});
    changed = true;
  }
  return changed;
}

bool FuseMaxPoolIntoConvolution::run(ir::Graph& g) {
  if (!enabled_) return false;
  std::vector<std::pair<ir::Node*, ir::Node*>> pairs;  // (convolution, pooling)
  for (ir::Node* p : g.nodes()) {
    if (p->op() != "max_pool2d") continue;
    ir::Value* y = p->input(0);
    ir::Node* c = y->producer();
    if (c->op() != "conv2d" || y->users().size() != 1 || y->stored() != DType::BF16 ||
        activation_of(c->attrs()) != Activation::None || c->replica() != p->replica())
      continue;
    pairs.emplace_back(c, p);
  }
  bool changed = false;
  for (const auto& [c, p] : pairs) {
    ir::Attrs attrs{{"stride", c->attrs().get<ir::Ints>("stride")},
                    {"pad", c->attrs().get<ir::Ints>("pad")},
                    {"pool_kernel", p->attrs().get<ir::Ints>("kernel")},
                    {"pool_stride", pool_stride(p->attrs())},
                    {"pool_pad", p->attrs().get<ir::Ints>("pad")},
                    {"activation", p->attrs().get<std::string>("activation")}};
    ir::Node* fused =
        g.add_node(op("conv2d_max_pool2d"), c->inputs(), std::move(attrs), c->name() + "+pool");
    fused->take_marks(*c);
    for (int o = 0; o < 2; ++o) {
      fused->output(o)->set_layout(p->output(o)->layout());
      fused->output(o)->set_stored(p->output(o)->stored());
    }
    if (const std::string why = no_kernel_takes(*fused); !why.empty()) {
      log_verbose("dispatch", "{} stays apart from {}: {}", p->describe(), c->describe(), why);
      g.remove({fused});
      continue;
    }
    fused->annotations().set("fused", p->name());
    g.move_before(fused, c);
    g.replace_uses(p->output(0), fused->output(0));
    g.replace_uses(p->output(1), fused->output(1));
    g.remove({p, c});
    changed = true;
  }
  return changed;
}

bool FuseActivationBackward::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* relu_bwd;
    // Readers rebuilt on dy: (reader, whether its argmax masks already; else it takes y).
    std::vector<std::pair<ir::Node*, bool>> maskers;
    ir::Node* sum;  // the add folded in, or null
  };
  std::vector<Match> matches;
  std::unordered_set<const ir::Node*> claimed;  // a sum reading two relu_bwd results folds once
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "relu_bwd" || n->inputs().size() != 2) continue;
    ir::Value* dx = n->output(0);
    if (dx->users().empty() ||
        std::find(g.outputs().begin(), g.outputs().end(), dx) != g.outputs().end())
      continue;
    Match m{n, {}, nullptr};
    bool ok = true;
    for (ir::Node* u : dx->users()) {
      const auto reads = std::count(u->inputs().begin(), u->inputs().end(), dx);
      if (u->replica() != n->replica() || reads != 1 || claimed.count(u) > 0) {
        ok = false;
        break;
      }
      if (takes_mask(*u) && u->input(0) == dx) {
        m.maskers.emplace_back(u, false);
      } else if (masks_by_argmax(*u, n->input(1)) && u->input(0) == dx) {
        m.maskers.emplace_back(u, true);
      } else if (u->op() == "add" && m.sum == nullptr &&
                 u->attrs().get<std::string>("activation") == "none" &&
                 u->input(0)->shape() == u->input(1)->shape() &&
                 u->output(0)->shape() == dx->shape()) {
        m.sum = u;
      } else {
        ok = false;
        break;
      }
    }
    if (!ok) continue;
    for (const auto& [u, by_argmax] : m.maskers) claimed.insert(u);
    if (m.sum != nullptr) claimed.insert(m.sum);
    matches.push_back(std::move(m));
  }
  for (const Match& m : matches) {
    ir::Value* dy = m.relu_bwd->input(0);
    ir::Value* y = m.relu_bwd->input(1);
    auto record = [&](ir::Node* fused, const ir::Node& old, const std::string& absorbed) {
      fused->take_marks(old);
      const ir::Attrs& a = old.annotations();
      fused->annotations().set(
          "fused", (a.has("fused") ? a.get<std::string>("fused") + ", " : "") + absorbed);
    };
    // dy and y are defined before the relu_bwd, so before each of its readers: every rebuilt
    // node takes its old one's place.
    for (const auto& [u, by_argmax] : m.maskers) {
      std::vector<ir::Value*> in = u->inputs();
      in[0] = dy;
      ir::Attrs attrs = u->attrs();
      if (!by_argmax) {
        in.push_back(y);
        attrs.set("activation", std::string("relu"));
      }
      ir::Node* fused = g.add_node(u->def(), std::move(in), std::move(attrs), u->name());
      record(fused, *u, m.relu_bwd->name());
      g.move_before(fused, u);
      for (std::size_t o = 0; o < u->outputs().size(); ++o)
        g.replace_uses(u->output(static_cast<int>(o)), fused->output(static_cast<int>(o)));
      g.remove({u});
    }
    if (m.sum != nullptr) {
      ir::Value* other =
          m.sum->input(0) == m.relu_bwd->output(0) ? m.sum->input(1) : m.sum->input(0);
      ir::Node* fused =
          g.add_node(m.relu_bwd->def(), {dy, y, other}, {}, m.relu_bwd->name() + "+add");
      record(fused, *m.sum, m.sum->name());
      g.move_before(fused, m.sum);
      g.replace_uses(m.sum->output(0), fused->output(0));
      g.remove({m.sum});
    }
    g.remove({m.relu_bwd});
  }
  return !matches.empty();
}

bool FoldBatchNorm::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* conv;
    ir::Node* bn;
    ir::Node* relu;  // or null
    bool bn_relu;    // the batch_norm's own activation is relu
  };
  auto bound = [](const ir::Value* v) { return v->producer()->def().is_source(); };
  std::vector<Match> matches;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "conv2d" || n->attrs().get<std::string>("activation") != "none") continue;
    ir::Node* bn = sole_reader(g, n->output(0), "batch_norm");
    if (bn == nullptr) continue;
    const auto& in = bn->inputs();
    if (!std::all_of(in.begin() + 1, in.end(), bound)) continue;
    const bool fused_relu = bn->attrs().get<std::string>("activation") == "relu";
    matches.push_back(
        {n, bn, fused_relu ? nullptr : sole_reader(g, bn->output(0), "relu"), fused_relu});
  }
  for (const Match& m : matches) {
    ir::Node* last = m.relu ? m.relu : m.bn;
    const bool relu = m.relu != nullptr || m.bn_relu;
    const Shape& w = m.conv->input(1)->shape();
    const bool has_bias = m.conv->inputs().size() > 2;
    ir::Value* bias = has_bias ? m.conv->input(2) : fill(g, Shape{w[0]}, 0.0f);
    std::vector<ir::Value*> fold_in{m.conv->input(1), bias};
    fold_in.insert(fold_in.end(), m.bn->inputs().begin() + 1, m.bn->inputs().end());
    ir::Node* fold =
        g.add_node(op("fold_batch_norm"), std::move(fold_in),
                   {{"eps", double{m.bn->attrs().get<float>("eps")}}}, m.bn->name() + ".fold");
    ir::Attrs attrs = m.conv->attrs();
    if (relu) attrs.set("activation", std::string("relu"));
    ir::Node* fused =
        g.add_node(m.conv->def(), {m.conv->input(0), fold->output(0), fold->output(1)},
                   std::move(attrs), m.conv->name() + "+batch_norm" + (relu ? "+relu" : ""));
    fused->take_marks(*m.conv);
    const ir::Attrs& bn_marks = m.bn->annotations();
    fused->annotations().set(
        "fused", m.bn->name() + (m.relu ? ", " + m.relu->name() : "") +
                     (bn_marks.has("fused") ? ", " + bn_marks.get<std::string>("fused") : ""));
    if (!has_bias) g.move_before(bias->producer(), last);
    g.move_before(fold, last);
    g.move_before(fused, last);
    g.replace_uses(last->output(0), fused->output(0));
    std::vector<ir::Node*> dead{m.conv, m.bn};
    if (m.relu) dead.push_back(m.relu);
    g.remove(dead);
  }
  return !matches.empty();
}

}  // namespace minidl::ops
