#include "minidl/parallel/thread_replicas.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "minidl/ops/registry.hpp"
#include "minidl/parallel/reduction_tree.hpp"

namespace minidl::parallel {
namespace {

constexpr int kShared = -1;  // depends on no replica
constexpr int kMixed = -2;   // depends on several replicas

// Class of every node: its replica, kShared or kMixed.
std::unordered_map<const ir::Node*, int> classify(const ir::Graph& g) {
  std::unordered_map<const ir::Node*, int> cls;
  for (const ir::Node* n : g.nodes()) {
    int c = n->replica() >= 0 ? n->replica() : kShared;
    for (const ir::Value* in : n->inputs()) {
      const int ci = cls.at(in->producer());
      if (ci == kShared || ci == c) continue;
      c = (c == kShared) ? ci : kMixed;
    }
    cls[n] = c;
  }
  return cls;
}

bool is_sum_over_replicas(const ir::Node* n, const std::unordered_map<const ir::Node*, int>& cls) {
  return n->op() == "add" && cls.at(n) == kMixed;
}

// Rebuilds each maximal chain of mixed adds (a gradient summed over the replicas) with three or
// more terms as a balanced tree, leaves ordered by replica. Returns whether anything changed.
bool balance_sums(ir::Graph& g) {
  const auto cls = classify(g);
  auto internal = [&](const ir::Value* v) {
    const ir::Node* p = v->producer();
    return is_sum_over_replicas(p, cls) && v->users().size() == 1 &&
           std::find(g.outputs().begin(), g.outputs().end(), v) == g.outputs().end();
  };
  struct Tree {
    ir::Node* root;
    std::vector<ir::Node*> adds;
    std::vector<ir::Value*> leaves;
  };
  std::vector<Tree> trees;
  for (ir::Node* n : g.nodes()) {
    if (!is_sum_over_replicas(n, cls)) continue;
    // A root: its output is not itself an internal term of a larger sum.
    const ir::Value* out = n->output();
    if (internal(out) && is_sum_over_replicas(out->users()[0], cls)) continue;
    Tree t{n, {}, {}};
    std::vector<ir::Node*> stack{n};
    while (!stack.empty()) {
      ir::Node* a = stack.back();
      stack.pop_back();
      t.adds.push_back(a);
      for (ir::Value* in : a->inputs()) {
        if (internal(in))
          stack.push_back(in->producer());
        else
          t.leaves.push_back(in);
      }
    }
    if (t.leaves.size() >= 3) trees.push_back(std::move(t));
  }
  for (Tree& t : trees) {
    std::stable_sort(t.leaves.begin(), t.leaves.end(), [&](ir::Value* a, ir::Value* b) {
      return cls.at(a->producer()) < cls.at(b->producer());
    });
    const std::string name = t.root->name();
    // The tree of reduction_tree.hpp over the leaves: for the micro-shards of deterministic
    // training, the same subtree that every other layout computes for these leaves.
    int made = 0;
    auto build = [&](auto& self, std::size_t lo, std::size_t n) -> ir::Value* {
      if (n == 1) return t.leaves[lo];
      const auto left = static_cast<std::size_t>(tree_left(static_cast<std::int64_t>(n)));
      ir::Value* a = self(self, lo, left);
      ir::Value* b = self(self, lo + left, n - left);
      ir::Node* sum =
          g.add_node(ops::op("add"), {a, b}, {}, name + ".tree" + std::to_string(made++));
      sum->take_marks(*t.root);
      g.move_before(sum, t.root);
      return sum->output();
    };
    ir::Value* total = build(build, 0, t.leaves.size());
    g.replace_uses(t.root->output(), total);
    g.remove(t.adds);
  }
  return !trees.empty();
}

}  // namespace

bool ThreadReplicas::run(ir::Graph& g) {
  bool changed = balance_sums(g);
  const auto cls = classify(g);
  int replicas = 0;
  for (const auto& [n, c] : cls) replicas = std::max(replicas, c + 1);
  // One replica still makes a section: its kernels then run on one thread, as they would
  // beside other replicas (deterministic training relies on it).
  if (replicas < 1) return changed;
  // Annotate, then reorder: shared work, the section of replica nodes, the rest. Sources keep
  // their places (they run nothing) and stay first.
  std::vector<ir::Node*> shared, section, rest;
  for (ir::Node* n : g.nodes()) {
    const int c = cls.at(n);
    if (c >= 0) n->set_replica(c);
    if (n->def().is_source() || c == kShared)
      shared.push_back(n);
    else if (c >= 0)
      section.push_back(n);
    else
      rest.push_back(n);
  }
  std::vector<ir::Node*> order = shared;
  order.insert(order.end(), section.begin(), section.end());
  order.insert(order.end(), rest.begin(), rest.end());
  if (order != g.nodes()) {
    // move_before one by one, from the back: each node goes before the one that follows it.
    for (std::size_t i = order.size() - 1; i-- > 0;) g.move_before(order[i], order[i + 1]);
    changed = true;
  }
  return changed || !section.empty();
}

}  // namespace minidl::parallel
