#include "minidl/ir/verifier.hpp"

#include <algorithm>
#include <unordered_map>

namespace minidl::ir {

void verify(const Graph& g) {
  std::unordered_map<const Node*, int> position;
  for (const Node* n : g.nodes()) position[n] = static_cast<int>(position.size());

  for (const Node* n : g.nodes()) {
    const int pos = position[n];
    for (std::size_t i = 0; i < n->inputs().size(); ++i) {
      const Value* in = n->input(static_cast<int>(i));
      auto it = position.find(in->producer());
      MINIDL_CHECK(it != position.end(), n->describe(), ": input ", i, " ", in->ref(),
                   " is produced by a node that is not in the graph");
      MINIDL_CHECK(it->second < pos, n->describe(), ": input ", i, " ", in->ref(),
                   " is used before ", in->producer()->describe(), " defines it");
      MINIDL_CHECK(std::count(in->users().begin(), in->users().end(), n) > 0, n->describe(),
                   ": use-list of ", in->ref(), " misses this node");
    }
    for (const auto& decl : n->def().attr_decls()) {
      const AttrValue* v = n->attrs().find(decl.name);
      MINIDL_CHECK(v != nullptr && v->index() == decl.kind, n->describe(), ": attribute '",
                   decl.name, "' is missing or of the wrong kind");
    }
    // Inference again: a pass that rewired inputs must keep shapes consistent.
    std::vector<Shape> shapes(n->outputs().size());
    std::vector<DType> dtypes(n->outputs().size(), DType::F32);
    InferCtx ctx(*n, shapes, dtypes);
    n->def().infer_fn()(ctx);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Value* out = n->output(static_cast<int>(i));
      MINIDL_CHECK(shapes[i] == out->shape() && dtypes[i] == out->dtype(), n->describe(),
                   ": output ", i, " is recorded as ", out->shape(), " ", out->dtype(),
                   " but its inputs give ", shapes[i], " ", dtypes[i]);
      const int shared = n->def().shares_input(static_cast<int>(i));
      if (shared < 0 || n->def().is_alias()) continue;
      // An in-place write must come after every other reader of the overwritten value.
      const Value* target = n->input(shared);
      for (const Node* reader : target->users()) {
        if (reader == n) continue;
        MINIDL_CHECK(position[reader] < pos, n->describe(), " overwrites ", target->ref(),
                     " in place before ", reader->describe(), " reads it");
      }
    }
  }
  for (const Value* v : g.outputs()) {
    MINIDL_CHECK(position.count(v->producer()) > 0, "graph output ", v->ref(),
                 " is produced by a node that is not in the graph");
  }
}

}  // namespace minidl::ir
