#include "minidl/ops/layouts.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "minidl/core/log.hpp"
#include "minidl/ir/graph.hpp"
#include "minidl/ops/onednn/kernels.hpp"

namespace minidl::ops {
namespace {

/// What the kernel the runtime picks for a node can do with layouts.
enum class Takes {
  Plain,  // plain values only
  Any,    // any layout on each value (KernelDef::layouts)
  Same,   // one layout shared by all of its values (elementwise ops)
};

struct Choice {
  Takes takes = Takes::Plain;
  // The kernel is one a changed representation helps: a oneDNN one for the blocked layout (it
  // saves reorders), a bf16 product for bf16 values (it saves conversions).
  bool anchor = false;
};
using Choices = std::unordered_map<const ir::Node*, Choice>;

/// What the kernel recorded for n (ir::choose_kernels) takes. Sources are bound plain and an
/// alias reinterprets the plain shape: they, and a node no kernel accepts, take plain values.
Choice choice(const ir::Node& n, ir::Backend preferred) {
  const ir::KernelChoice* c = n.kernel(preferred);
  if (c == nullptr || c->kernel == nullptr) return {};
  if (c->kernel->layouts) return {Takes::Any, c->kernel->backend == ir::Backend::OneDnn};
  return {n.def().is_elementwise() ? Takes::Same : Takes::Plain, false};
}

/// The same for values stored as bf16: only kernels with KernelDef::bf16_values take them, and
/// the anchors are the nodes computing a bf16 product.
Choice bf16_choice(const ir::Node& n, ir::Backend preferred) {
  const ir::KernelChoice* c = n.kernel(preferred);
  if (c == nullptr || c->kernel == nullptr || !c->kernel->bf16_values) return {};
  const bool product = c->kernel->bf16 && ir::node_precision(n) == ir::Precision::BF16;
  if (c->kernel->layouts) return {Takes::Any, product};
  return {n.def().is_elementwise() ? Takes::Same : Takes::Plain, product};
}

std::vector<ir::Value*> values_of(const ir::Node& n) {
  std::vector<ir::Value*> v(n.inputs().begin(), n.inputs().end());
  v.insert(v.end(), n.outputs().begin(), n.outputs().end());
  return v;
}

/// Shrinks `set` to a fixed point: a value stays only if its producer and every reader take it,
/// an elementwise node's values are all in or all out, and the value touches an anchor, directly
/// or through elementwise nodes (else the change would only cost other kernels a reorder).
void settle(const ir::Graph& g, const Choices& choices, std::unordered_set<const ir::Value*>& set) {
  bool changed = true;
  while (changed) {
    changed = false;
    auto drop = [&](const ir::Value* v) { changed |= set.erase(v) > 0; };
    for (const ir::Node* n : g.nodes()) {
      const Choice c = choices.at(n);
      const std::vector<ir::Value*> vals = values_of(*n);
      if (c.takes == Takes::Plain) {
        for (const ir::Value* v : vals) drop(v);
      } else if (c.takes == Takes::Same) {
        const bool all = std::all_of(vals.begin(), vals.end(),
                                     [&](const ir::Value* v) { return set.count(v) > 0; });
        if (!all)
          for (const ir::Value* v : vals) drop(v);
      }
    }
    // A value touches an anchor through its producer or a reader, or through an elementwise node
    // whose values (all in the set here) include one that does: a gradient sum of two native
    // outputs that feeds a oneDNN convolution (BatchNorm's dx) stays blocked with the rest.
    std::unordered_set<const ir::Value*> touch;
    for (const ir::Value* v : set) {
      bool anchor = choices.at(v->producer()).anchor;
      for (const ir::Node* u : v->users()) anchor |= choices.at(u).anchor;
      if (anchor) touch.insert(v);
    }
    for (bool grew = true; grew;) {
      grew = false;
      for (const ir::Node* n : g.nodes()) {
        if (choices.at(n).takes != Takes::Same) continue;
        const std::vector<ir::Value*> vals = values_of(*n);
        const bool any = std::any_of(vals.begin(), vals.end(),
                                     [&](const ir::Value* v) { return touch.count(v) > 0; });
        if (!any) continue;
        for (const ir::Value* v : vals)
          if (set.count(v)) grew |= touch.insert(v).second;
      }
    }
    for (auto it = set.begin(); it != set.end();) {
      if (touch.count(*it)) {
        ++it;
      } else {
        it = set.erase(it);
        changed = true;
      }
    }
  }
}

/// The 4-D values of g, produced by a node and not graph outputs, in no layout yet, whose
/// channels fill whole blocks of `block`, and of a dtype `want` accepts.
template <typename Want>
std::unordered_set<const ir::Value*> candidates(const ir::Graph& g, int block, Want&& want) {
  std::unordered_set<const ir::Value*> set;
  const std::unordered_set<const ir::Value*> outputs(g.outputs().begin(), g.outputs().end());
  for (const ir::Node* n : g.nodes()) {
    for (const ir::Value* v : n->outputs()) {
      const Shape& s = v->shape();
      if (s.rank() == 4 && want(v->dtype()) && s[1] % block == 0 && !outputs.count(v) &&
          v->layout().empty() && v->stored() == v->dtype())
        set.insert(v);
    }
  }
  return set;
}

/// Keeps bf16 activations between bf16 kernels (see the header); returns how many it stored as
/// bf16.
int assign_bf16(ir::Graph& g, ir::Backend preferred, const std::string& layout) {
  Choices choices;
  bool any_product = false;
  for (const ir::Node* n : g.nodes()) {
    choices[n] = bf16_choice(*n, preferred);
    any_product |= choices[n].anchor;
  }
  if (!any_product) return 0;
  // f32 activations only: i32 indices (max pooling's argmax) keep their layout rules.
  auto set = candidates(g, ir::channel_block(layout), [](DType t) { return t == DType::F32; });
  settle(g, choices, set);
  int count = 0;
  for (ir::Node* n : g.nodes()) {
    for (ir::Value* v : n->outputs()) {
      if (!set.count(v)) continue;
      v->set_layout(layout);
      v->set_stored(DType::BF16);
      ++count;
      log_verbose("layouts", "{} of {} -> {} bf16", v->ref(), n->describe(), layout);
    }
  }
  if (count == 0) {
    log_verbose("layouts",
                "no activation stored as bf16: none lies between bf16 kernels with channels "
                "that fill the bf16 convolutions' layout {} (blocks of {})",
                layout, ir::channel_block(layout));
    return 0;
  }
  // The choices were made for f32 values; each kernel now sees bf16 ones. Where a kernel's
  // supports declines them after all (oneDNN lacking a bf16 primitive on this CPU), its node
  // would have no kernel: its values go back to f32, until every node has one.
  for (bool reverted = true; reverted;) {
    reverted = false;
    ir::choose_kernels(g, preferred);
    for (const ir::Node* n : g.nodes()) {
      if (n->def().is_source() || n->def().is_alias()) continue;
      const ir::KernelChoice* c = n->kernel(preferred);
      if (c != nullptr && c->kernel != nullptr) continue;
      for (ir::Value* v : values_of(*n)) {
        if (v->stored() != DType::BF16) continue;
        log_verbose("layouts", "{} back to f32: {} has no kernel for it{}", v->ref(), n->describe(),
                    c != nullptr ? c->declined : std::string());
        v->set_stored(DType::F32);
        v->set_layout("");
        reverted = true;
        --count;
      }
    }
  }
  // i32 indices between kernels that run in the bf16 layout (max pooling's argmax, between the
  // forward and the backward on bf16 activations) take it too, when the data output beside them
  // does: the pooling then converts its workspace to and from argmax contiguously (in a plain
  // argmax a position's channels lie a plane apart).
  auto indices = candidates(g, ir::channel_block(layout), [](DType t) { return t == DType::I32; });
  for (ir::Node* n : g.nodes()) {
    for (ir::Value* v : n->outputs()) {
      if (!indices.count(v)) continue;
      // A pooling whose output stays f32 and plain (before a flatten) keeps them plain too: its
      // kernels then transpose a group at a time between x's layout and the plain output and
      // indices (pool2 of the CIFAR CNN: 105 + 162 -> 62 + 90 us per step, forward + backward).
      if (n->output(0)->stored() != DType::BF16) continue;
      std::vector<const ir::Node*> touching(v->users().begin(), v->users().end());
      touching.push_back(n);
      const bool all_bf16 = std::all_of(touching.begin(), touching.end(), [&](const ir::Node* u) {
        const ir::KernelChoice* c = u->kernel(preferred);
        if (c == nullptr || c->kernel == nullptr || !c->kernel->layouts || !c->kernel->bf16_values)
          return false;
        const std::vector<ir::Value*> vals = values_of(*u);
        return std::any_of(vals.begin(), vals.end(),
                           [](const ir::Value* w) { return w->stored() == DType::BF16; });
      });
      if (!all_bf16) continue;
      v->set_layout(layout);
      log_verbose("layouts", "{} of {} -> {}", v->ref(), n->describe(), layout);
    }
  }
  ir::choose_kernels(g, preferred);
  return count;
}

/// A shared bf16 copy (share_bf16_factors) of a value its producer can store as bf16 itself: a
/// plain f32 value, or an alias of one (a flatten), read by nothing but the copy and made by a
/// kernel that writes bf16 values (KernelDef::bf16_values). The value is then stored as bf16,
/// plain, the copy's readers read it and the copy goes: the producer rounds what the copy would
/// have (the same bits), and the step makes one pass over the value fewer (the CIFAR CNN's pool2
/// output before the flatten, which fc1's forward and weight gradient share). Returns how many
/// copies it folded.
int fold_bf16_copies(ir::Graph& g, ir::Backend preferred) {
  const std::unordered_set<const ir::Value*> outputs(g.outputs().begin(), g.outputs().end());
  std::vector<ir::Node*> copies;
  for (ir::Node* n : g.nodes())
    if (n->op() == "bf16_copy" && n->output()->stored() == DType::BF16 &&
        n->output()->layout().empty())
      copies.push_back(n);
  int folded = 0;
  for (ir::Node* copy : copies) {
    // The value and the values it aliases, up to the one a kernel writes.
    std::vector<ir::Value*> chain{copy->input(0)};
    while (chain.back()->producer()->def().is_alias())
      chain.push_back(chain.back()->producer()->input(0));
    ir::Node* producer = chain.back()->producer();
    const bool alone = std::all_of(chain.begin(), chain.end(), [&](const ir::Value* v) {
      return v->users().size() == 1 && !outputs.count(v) && v->dtype() == DType::F32 &&
             v->stored() == DType::F32 && v->layout().empty();
    });
    const ir::KernelChoice* c = producer->kernel(preferred);
    if (!alone || producer->def().is_source() || c == nullptr || c->kernel == nullptr ||
        !c->kernel->bf16_values)
      continue;
    for (ir::Value* v : chain) v->set_stored(DType::BF16);
    // The copy's readers already read a plain bf16 value; only the producer's choice may change.
    if (const ir::KernelChoice now = ir::choose_kernel(*producer, preferred);
        now.kernel == nullptr) {
      for (ir::Value* v : chain) v->set_stored(DType::F32);
      continue;
    }
    g.replace_uses(copy->output(), copy->input(0));
    g.remove({copy});
    log_verbose("layouts", "{} stored as bf16 by {}: its copy {} folded into it",
                chain.front()->ref(), producer->describe(), copy->name());
    ++folded;
  }
  if (folded > 0) ir::choose_kernels(g, preferred);
  return folded;
}

/// An i32 index output still plain (max pooling's argmax) takes the layout of the data output
/// its node computes alongside it (output 0, of the same shape) when every kernel touching it
/// takes any layout: the kernels then walk both alike. Returns how many it laid out.
int indices_follow_data(ir::Graph& g, ir::Backend preferred) {
  auto any_layout = [&](const ir::Node* n) {
    const ir::KernelChoice* c = n->kernel(preferred);
    return c != nullptr && c->kernel != nullptr && c->kernel->layouts;
  };
  std::vector<std::pair<ir::Value*, std::string>> moves;
  const std::unordered_set<const ir::Value*> outputs(g.outputs().begin(), g.outputs().end());
  for (ir::Node* n : g.nodes()) {
    if (n->outputs().size() < 2 || n->output(0)->layout().empty() || !any_layout(n)) continue;
    for (std::size_t o = 1; o < n->outputs().size(); ++o) {
      ir::Value* v = n->output(static_cast<int>(o));
      if (v->dtype() != DType::I32 || !v->layout().empty() || outputs.count(v) ||
          v->shape() != n->output(0)->shape() ||
          !std::all_of(v->users().begin(), v->users().end(), any_layout))
        continue;
      moves.emplace_back(v, n->output(0)->layout());
    }
  }
  for (auto& [v, layout] : moves) {
    v->set_layout(layout);
    log_verbose("layouts", "{} of {} -> {} (its node's output layout)", v->ref(),
                v->producer()->describe(), layout);
  }
  if (!moves.empty()) ir::choose_kernels(g, preferred);
  return static_cast<int>(moves.size());
}

}  // namespace

const std::string& blocked_layout() {
#if MINIDL_WITH_ONEDNN
  static const std::string layout = onednn::blocked_conv_layout();
#else
  static const std::string layout;
#endif
  return layout;
}

bool bf16_activation(const ir::Value& v) {
  return v.stored() == DType::BF16 && !v.layout().empty();
}

const std::string& bf16_layout() {
#if MINIDL_WITH_ONEDNN
  static const std::string layout = onednn::bf16_conv_layout();
#else
  static const std::string layout;
#endif
  return layout;
}

bool PropagateLayouts::run(ir::Graph& g) {
  // Every node's kernel, chosen once and recorded: this pass decides by them, and the runtime
  // runs them.
  ir::choose_kernels(g, preferred_);
  int count = 0;
  // bf16 values first: they take the bf16 convolutions' layout, the blocked f32 one the rest.
  if (!bf16_layout().empty()) {
    if (const int n = assign_bf16(g, preferred_, bf16_layout()); n > 0) {
      // The stored types changed the choices around those values (Value::set_stored).
      ir::choose_kernels(g, preferred_);
      count += n;
    }
    count += fold_bf16_copies(g, preferred_);
  }
  const std::string& layout = blocked_layout();
  if (layout.empty()) return count + indices_follow_data(g, preferred_) > 0;

  // Match: what each node's kernel takes, and the values that could be blocked at all: f32
  // activations and i32 indices (max pooling's argmax).
  // A kernel with a bf16 activation runs in the bf16 layout: its f32 values gain nothing from
  // the blocked one, and max pooling's argmax must then stay plain (the pooling converts its
  // workspace to a plain argmax, or to one in the primitive's own layout). A shared bf16 copy
  // is no activation (bf16_activation) and leaves the layouts alone.
  Choices choices;
  for (const ir::Node* n : g.nodes()) {
    const std::vector<ir::Value*> vals = values_of(*n);
    const bool bf16 = std::any_of(vals.begin(), vals.end(),
                                  [](const ir::Value* v) { return bf16_activation(*v); });
    choices[n] = bf16 ? Choice{} : choice(*n, preferred_);
  }
  auto blocked = candidates(g, ir::channel_block(layout),
                            [](DType t) { return t == DType::F32 || t == DType::I32; });
  settle(g, choices, blocked);

  // Mutate: in graph order, so the log reads like the graph.
  int blocked_count = 0;
  for (ir::Node* n : g.nodes()) {
    for (ir::Value* v : n->outputs()) {
      if (!blocked.count(v)) continue;
      v->set_layout(layout);
      ++blocked_count;
      log_verbose("layouts", "{} of {} -> {}", v->ref(), n->describe(), layout);
    }
  }
  // A new layout drops the records of the nodes around the value (Value::set_layout): choose
  // their kernels again, for the layouts they now see. Each still takes it, as decided above.
  if (blocked_count > 0) ir::choose_kernels(g, preferred_);
  return count + blocked_count + indices_follow_data(g, preferred_) > 0;
}

}  // namespace minidl::ops
