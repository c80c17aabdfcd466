#include "minidl/ops/fusion.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "minidl/ops/ops.hpp"

namespace minidl::ops {
namespace {

// Whether n can apply an activation in its own store (an "activation" attribute, still none).
bool fusable(const ir::Node& n) {
  const auto& attrs = n.def().attr_decls();
  const bool has_activation = std::any_of(
      attrs.begin(), attrs.end(), [](const ir::AttrDecl& a) { return a.name == "activation"; });
  return has_activation && n.attrs().get<std::string>("activation") == "none";
}

// Whether n can also add a bias: its last input is the optional "bias", and n has none yet.
bool takes_bias(const ir::Node& n) {
  const ir::OpDef& d = n.def();
  const auto& names = d.input_names();
  return !names.empty() && names.back() == "bias" &&
         d.min_inputs() < static_cast<int>(names.size()) && n.inputs().size() < names.size();
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
    if (!fusable(*n)) continue;
    Match m{n, takes_bias(*n) ? sole_reader(g, n->output(0), "bias_add") : nullptr, nullptr};
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

bool FuseUpdateIntoProduct::run(ir::Graph& g) {
  if (!enabled_) return false;
  std::vector<std::pair<ir::Node*, ir::Node*>> matches;  // (matmul, sgd)
  for (ir::Node* n : g.nodes()) {
    // A plain update: no weight decay, no clipping factor (grad_scale).
    if (n->op() != "sgd" || n->attrs().get<float>("weight_decay") != 0.0f ||
        n->inputs().size() != 3)
      continue;
    ir::Value* grad = n->input(1);
    ir::Node* mm = grad->producer();
    if (mm->op() != "matmul" || mm->inputs().size() != 2 ||
        mm->attrs().get<std::string>("activation") != "none" || !read_once(g, grad))
      continue;
    // A product that computes in bf16 keeps its bf16 kernel: the fused op has none.
    if (ir::node_precision(*mm) == ir::Precision::BF16 &&
        !ir::has_bf16_kernel(ops::op("matmul_accumulate")))
      continue;
    // The GEMM writes the parameter while it reads its operands: never one of them.
    ir::Value* param = n->input(0);
    if (mm->input(0) == param || mm->input(1) == param) continue;
    matches.emplace_back(mm, n);
  }
  for (const auto& [mm, sgd] : matches) {
    ir::Node* fused = g.add_node(ops::op("matmul_accumulate"),
                                 {mm->input(0), mm->input(1), sgd->input(0), sgd->input(2)},
                                 {{"trans_a", mm->attrs().get<bool>("trans_a")},
                                  {"trans_b", mm->attrs().get<bool>("trans_b")},
                                  {"alpha", -1.0f},
                                  {"beta", 1.0f}},
                                 mm->name() + "+sgd");
    fused->take_marks(*sgd);
    fused->annotations().set("fused", sgd->name());
    // The product's operands are defined before the matmul, and every reader of the parameter's
    // old value runs before the update: the fused node takes the update's place.
    g.move_before(fused, sgd);
    g.replace_uses(sgd->output(0), fused->output(0));
    g.remove({sgd, mm});
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

bool FoldBatchNorm::run(ir::Graph& g) {
  if (!enabled_) return false;
  struct Match {
    ir::Node* conv;
    ir::Node* bn;
    ir::Node* relu;  // or null
  };
  auto bound = [](const ir::Value* v) { return v->producer()->def().is_source(); };
  std::vector<Match> matches;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != "conv2d" || n->attrs().get<std::string>("activation") != "none") continue;
    ir::Node* bn = sole_reader(g, n->output(0), "batch_norm");
    if (bn == nullptr) continue;
    const auto& in = bn->inputs();
    if (!std::all_of(in.begin() + 1, in.end(), bound)) continue;
    matches.push_back({n, bn, sole_reader(g, bn->output(0), "relu")});
  }
  for (const Match& m : matches) {
    ir::Node* last = m.relu ? m.relu : m.bn;
    const Shape& w = m.conv->input(1)->shape();
    const bool has_bias = m.conv->inputs().size() > 2;
    ir::Value* bias = has_bias ? m.conv->input(2) : fill(g, Shape{w[0]}, 0.0f);
    std::vector<ir::Value*> fold_in{m.conv->input(1), bias};
    fold_in.insert(fold_in.end(), m.bn->inputs().begin() + 1, m.bn->inputs().end());
    ir::Node* fold =
        g.add_node(op("fold_batch_norm"), std::move(fold_in),
                   {{"eps", double{m.bn->attrs().get<float>("eps")}}}, m.bn->name() + ".fold");
    ir::Attrs attrs = m.conv->attrs();
    if (m.relu) attrs.set("activation", std::string("relu"));
    ir::Node* fused =
        g.add_node(m.conv->def(), {m.conv->input(0), fold->output(0), fold->output(1)},
                   std::move(attrs), m.conv->name() + "+batch_norm" + (m.relu ? "+relu" : ""));
    fused->take_marks(*m.conv);
    fused->annotations().set("fused", m.bn->name() + (m.relu ? ", " + m.relu->name() : ""));
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
