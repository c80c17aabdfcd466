#include "minidl/ir/pass.hpp"

#include <cstdlib>
#include <unordered_set>

#include "minidl/core/log.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ir/verifier.hpp"

namespace minidl::ir {

PassManager& PassManager::add(std::unique_ptr<Pass> pass) {
  passes_.push_back(std::move(pass));
  return *this;
}

bool PassManager::run(Graph& g) {
  const char* dump_after = std::getenv("MINIDL_DUMP_AFTER");
  const char* format = std::getenv("MINIDL_DUMP_FORMAT");
  bool changed = false;
  for (auto& pass : passes_) {
    const bool c = pass->run(g);
    changed |= c;
    log_verbose("passes", "{}: {}", pass->name(), c ? "changed the graph" : "no change");
    if (verify_) {
      try {
        verify(g);
      } catch (const Error& e) {
        MINIDL_FAIL("after pass '", pass->name(), "': ", e.what());
      }
    }
    if (dump_after && (pass->name() == dump_after || std::string_view(dump_after) == "all")) {
      const bool dot = format && std::string_view(format) == "dot";
      fmt::print(stderr, "// graph after pass '{}'\n{}", pass->name(),
                 dot ? to_dot(g) : to_text(g));
    }
  }
  return changed;
}

bool DeadCodeElimination::run(Graph& g) {
  std::unordered_set<const Node*> live;
  std::vector<const Node*> stack;
  auto mark = [&](const Node* n) {
    if (live.insert(n).second) stack.push_back(n);
  };
  for (const Value* v : g.outputs()) mark(v->producer());
  for (const Node* n : g.nodes())
    if (n->def().has_side_effect()) mark(n);
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const Value* in : n->inputs()) mark(in->producer());
  }
  std::vector<Node*> dead;
  for (Node* n : g.nodes())
    if (!live.count(n) && !n->def().is_source()) dead.push_back(n);
  if (dead.empty()) return false;
  g.remove(dead);
  return true;
}

}  // namespace minidl::ir
