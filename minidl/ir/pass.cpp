#include "minidl/ir/pass.hpp"

#include <algorithm>
#include <cstdlib>
#include <unordered_set>

#include "minidl/core/log.hpp"
#include "minidl/ir/order.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ir/verifier.hpp"

namespace minidl::ir {

PassManager::PassManager(std::vector<std::string> facts) : facts_(std::move(facts)) {}

PassManager& PassManager::add(std::unique_ptr<Pass> pass) {
  for (const std::string& need : pass->needs()) {
    MINIDL_CHECK(std::find(facts_.begin(), facts_.end(), need) != facts_.end(), "pass pipeline: '",
                 pass->name(), "' needs '", need, "', which no pass before it provides (pipeline: ",
                 passes_.empty() ? std::string("empty") : describe(), "; starting facts: ",
                 facts_.empty() ? std::string("none") : fmt::format("{}", fmt::join(facts_, ", ")),
                 ")");
  }
  for (std::string& fact : pass->provides()) facts_.push_back(std::move(fact));
  passes_.push_back(std::move(pass));
  return *this;
}

std::string PassManager::describe() const {
  std::string s;
  for (const auto& p : passes_) s += (s.empty() ? "" : " -> ") + std::string(p->name());
  return s;
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

bool UpdatesWhenReady::run(Graph& g) {
  // An update: a node of the update phase that writes a value in place (an optimizer op, or a
  // product fused with one) and moves no data between ranks.
  auto update = [](const Node* n) {
    if (n->phase() != Phase::Update || n->def().comm_role() != CommRole::None) return false;
    for (std::size_t o = 0; o < n->outputs().size(); ++o)
      if (n->def().shares_input(static_cast<int>(o)) >= 0 && !n->def().is_alias()) return true;
    return false;
  };
  bool any = false;
  for (const Node* n : g.nodes()) {
    if (n->replica() >= 0) return false;
    any = any || update(n);
  }
  if (!any) return false;
  // Sources first (an update's state is one), then each update as soon as it may run.
  auto key = [&](const Node* n) -> std::int64_t {
    if (n->def().is_source()) return -1;
    return update(n) ? 0 : 1;
  };
  std::vector<Node*> order = ordered_by(g, key, {}, "updates-when-ready");
  if (order == g.nodes()) return false;
  g.reorder(std::move(order));
  return true;
}

}  // namespace minidl::ir
