#include "minidl/ops/layouts.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

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
  bool onednn = false;  // the kernel is oneDNN's: a blocked layout saves it reorders
};

/// What the kernel recorded for n (ir::choose_kernels) takes. Sources are bound plain and an
/// alias reinterprets the plain shape: they, and a node no kernel accepts, take plain values.
Choice choice(const ir::Node& n, ir::Backend preferred) {
  const ir::KernelChoice* c = n.kernel(preferred);
  if (c == nullptr || c->kernel == nullptr) return {};
  if (c->kernel->layouts) return {Takes::Any, c->kernel->backend == ir::Backend::OneDnn};
  return {n.def().is_elementwise() ? Takes::Same : Takes::Plain, false};
}

std::vector<ir::Value*> values_of(const ir::Node& n) {
  std::vector<ir::Value*> v(n.inputs().begin(), n.inputs().end());
  v.insert(v.end(), n.outputs().begin(), n.outputs().end());
  return v;
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

bool PropagateLayouts::run(ir::Graph& g) {
  // Every node's kernel, chosen once and recorded: this pass decides by them, and the runtime
  // runs them.
  ir::choose_kernels(g, preferred_);
  const std::string& layout = blocked_layout();
  if (layout.empty()) return false;
  const int block = ir::channel_block(layout);

  // Match: what each node's kernel takes, and the values that could be blocked at all.
  std::unordered_map<const ir::Node*, Choice> choices;
  for (const ir::Node* n : g.nodes()) choices[n] = choice(*n, preferred_);
  std::unordered_set<const ir::Value*> blocked;
  const std::unordered_set<const ir::Value*> outputs(g.outputs().begin(), g.outputs().end());
  for (const ir::Node* n : g.nodes()) {
    for (const ir::Value* v : n->outputs()) {
      const Shape& s = v->shape();
      // f32 activations and i32 indices (max pooling's argmax).
      const bool word = v->dtype() == DType::F32 || v->dtype() == DType::I32;
      if (s.rank() == 4 && word && s[1] % block == 0 && !outputs.count(v) && v->layout().empty())
        blocked.insert(v);
    }
  }

  // Shrink to a fixed point: a value stays blocked only if its producer and every reader take
  // it, an elementwise node's values are all blocked or all plain, and the value touches a
  // oneDNN kernel, directly or through elementwise nodes (else a blocked layout would only cost
  // the native code a reorder elsewhere).
  bool changed = true;
  while (changed) {
    changed = false;
    auto drop = [&](const ir::Value* v) { changed |= blocked.erase(v) > 0; };
    for (const ir::Node* n : g.nodes()) {
      const Choice c = choices.at(n);
      const std::vector<ir::Value*> vals = values_of(*n);
      if (c.takes == Takes::Plain) {
        for (const ir::Value* v : vals) drop(v);
      } else if (c.takes == Takes::Same) {
        const bool all = std::all_of(vals.begin(), vals.end(),
                                     [&](const ir::Value* v) { return blocked.count(v) > 0; });
        if (!all)
          for (const ir::Value* v : vals) drop(v);
      }
    }
    // A value touches oneDNN through its producer or a reader, or through an elementwise node
    // whose values (all blocked here) include one that does: a gradient sum of two native
    // outputs that feeds a oneDNN convolution (BatchNorm's dx) stays blocked with the rest.
    std::unordered_set<const ir::Value*> touch;
    for (const ir::Value* v : blocked) {
      bool onednn = choices.at(v->producer()).onednn;
      for (const ir::Node* u : v->users()) onednn |= choices.at(u).onednn;
      if (onednn) touch.insert(v);
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
          if (blocked.count(v)) grew |= touch.insert(v).second;
      }
    }
    for (auto it = blocked.begin(); it != blocked.end();) {
      if (touch.count(*it)) {
        ++it;
      } else {
        it = blocked.erase(it);
        changed = true;
      }
    }
  }

  // Mutate: in graph order, so the log reads like the graph.
  int count = 0;
  for (ir::Node* n : g.nodes()) {
    for (ir::Value* v : n->outputs()) {
      if (!blocked.count(v)) continue;
      v->set_layout(layout);
      ++count;
      log_verbose("layouts", "{} of {} -> {}", v->ref(), n->describe(), layout);
    }
  }
  // A new layout drops the records of the nodes around the value (Value::set_layout): choose
  // their kernels again, for the layouts they now see. Each still takes it, as decided above.
  if (count > 0) ir::choose_kernels(g, preferred_);
  return count > 0;
}

}  // namespace minidl::ops
