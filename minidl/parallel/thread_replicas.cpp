#include "minidl/parallel/thread_replicas.hpp"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "minidl/ir/order.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/parallel/reduction_tree.hpp"

namespace minidl::parallel {
namespace {

constexpr int kShared = -1;  // depends on no replica
constexpr int kMixed = -2;   // depends on several replicas

bool is_cross_replica_sum(const ir::Node* n) { return &n->def() == &ops::op_cross_replica_sum; }

// What a node depends on: its class (a replica, kShared or kMixed) and its level, the number of
// cross-replica sums on the longest path to it. A cross-replica sum is a barrier: its output is
// shared again (every replica reads the same sum), one level up.
struct Class {
  int replica = kShared;
  int level = 0;
};

std::unordered_map<const ir::Node*, Class> classify(const ir::Graph& g) {
  std::unordered_map<const ir::Node*, Class> cls;
  // A lowered graph is not yet in a valid order while this pass works on it: classify in
  // dependency order, whatever the node order.
  std::vector<const ir::Node*> pending(g.nodes().begin(), g.nodes().end());
  while (!pending.empty()) {
    std::vector<const ir::Node*> later;
    for (const ir::Node* n : pending) {
      Class c{n->replica() >= 0 ? n->replica() : kShared, 0};
      bool ready = true;
      for (const ir::Value* in : n->inputs()) {
        const auto it = cls.find(in->producer());
        if (it == cls.end()) {
          ready = false;
          break;
        }
        const Class ci = it->second;
        c.level = std::max(c.level, ci.level);
        if (ci.replica == kShared || ci.replica == c.replica) continue;
        c.replica = (c.replica == kShared) ? ci.replica : kMixed;
      }
      if (!ready) {
        later.push_back(n);
        continue;
      }
      if (is_cross_replica_sum(n)) c = {kShared, c.level + 1};
      cls[n] = c;
    }
    MINIDL_ASSERT(later.size() < pending.size(), "thread-replicas: the graph has a cycle");
    pending = std::move(later);
  }
  return cls;
}

bool is_sum_over_replicas(const ir::Node* n,
                          const std::unordered_map<const ir::Node*, Class>& cls) {
  return n->op() == "add" && cls.at(n).replica == kMixed;
}

// Each replica's forward writes its own copy of a cross-replica sum; the k-th copy with a key in
// replica r matches the k-th with that key in every other replica. Each set of copies becomes
// one sum over the replicas (a chain of adds in replica order, which balance_sums turns into the
// tree) and one cross_replica_sum node of no replica reading it, whose output every replica
// reads. The reduction across ranks is added later (the cross-replica-sums pass). Returns
// whether anything changed.
bool join_replica_copies(ir::Graph& g) {
  const auto cls = classify(g);
  // key -> replica -> copies in graph order
  std::map<std::string, std::map<int, std::vector<ir::Node*>>> copies;
  for (ir::Node* n : g.nodes()) {
    if (!is_cross_replica_sum(n)) continue;
    const int r = cls.at(n->input(0)->producer()).replica;
    MINIDL_CHECK(r != kMixed, n->describe(), " sums a value of several replicas");
    if (r == kShared) continue;  // one sum for all already
    copies[n->attrs().get<std::string>("key")][r].push_back(n);
  }
  bool changed = false;
  for (auto& [key, by_replica] : copies) {
    const std::size_t count = by_replica.begin()->second.size();
    for (const auto& [r, nodes] : by_replica) {
      MINIDL_CHECK(nodes.size() == count, "cross_replica_sum '", key, "' appears ", count,
                   " time(s) in replica ", by_replica.begin()->first, " but ", nodes.size(),
                   " in replica ", r, ": every replica must reach the same sums");
    }
    if (by_replica.size() < 2) continue;
    for (std::size_t k = 0; k < count; ++k) {
      ir::Node* first = by_replica.begin()->second[k];
      ir::Value* total = nullptr;
      for (const auto& [r, nodes] : by_replica) {
        ir::Value* x = nodes[k]->input(0);
        if (total == nullptr) {
          total = x;
          continue;
        }
        ir::Node* add = g.add_node(ops::op_add, {total, x}, {}, key + ".replica_sum");
        add->take_marks(*first);
        add->set_replica(-1);
        total = add->output();
      }
      ir::Node* sum = g.add_node(ops::op_cross_replica_sum, {total}, first->attrs(), key);
      sum->take_marks(*first);
      sum->set_replica(-1);
      std::vector<ir::Node*> old;
      for (const auto& [r, nodes] : by_replica) {
        g.replace_uses(nodes[k]->output(), sum->output());
        old.push_back(nodes[k]);
      }
      g.remove(old);
    }
    changed = true;
  }
  return changed;
}

// Rebuilds each maximal chain of mixed adds (a gradient summed over the replicas, a
// cross-replica sum's terms) with three or more terms as a balanced tree, leaves ordered by
// replica. Returns whether anything changed.
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
      return cls.at(a->producer()).replica < cls.at(b->producer()).replica;
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
      ir::Node* sum = g.add_node(ops::op_add, {a, b}, {}, name + ".tree" + std::to_string(made++));
      sum->take_marks(*t.root);
      return sum->output();
    };
    ir::Value* total = build(build, 0, t.leaves.size());
    g.replace_uses(t.root->output(), total);
    g.remove(t.adds);
  }
  return !trees.empty();
}

// The execution order: level by level, each level's shared work, then its replica nodes (one
// parallel section), then the nodes that join several replicas; sources first, the optimizer's
// updates last. Among the nodes
// that may run, the one earliest in that order and then in the current order goes next, so an
// already valid order of one level only moves nodes between those three groups (stably). A node
// that overwrites a value in place waits for the value's other readers.
std::vector<ir::Node*> schedule(const ir::Graph& g,
                                const std::unordered_map<const ir::Node*, Class>& cls) {
  std::int64_t levels = 0;
  for (const auto& [n, c] : cls) levels = std::max<std::int64_t>(levels, c.level + 1);
  auto group = [&](const ir::Node* n) -> std::int64_t {
    if (n->def().is_source()) return -1;
    // The optimizer's updates after the whole backward, where the data-parallel pass reduces
    // their gradients.
    if (n->phase() == ir::Phase::Update) return 3 * levels;
    const Class c = cls.at(n);
    const std::int64_t base = 3 * static_cast<std::int64_t>(c.level);
    return c.replica == kShared ? base : c.replica == kMixed ? base + 2 : base + 1;
  };
  return ir::ordered_by(g, group, {}, "thread-replicas");
}

}  // namespace

bool ThreadReplicas::run(ir::Graph& g) {
  bool changed = join_replica_copies(g);
  changed = balance_sums(g) || changed;
  const auto cls = classify(g);
  int replicas = 0;
  for (const auto& [n, c] : cls) replicas = std::max(replicas, c.replica + 1);
  // One replica still makes a section: its kernels then run on one thread, as they would
  // beside other replicas (deterministic training relies on it).
  if (replicas < 1) return changed;
  bool sections = false;
  for (ir::Node* n : g.nodes()) {
    const int r = cls.at(n).replica;
    if (r >= 0) {
      n->set_replica(r);
      sections = sections || !n->def().is_source();
    }
  }
  std::vector<ir::Node*> order = schedule(g, cls);
  if (order != g.nodes()) {
    g.reorder(std::move(order));
    changed = true;
  }
  return changed || sections;
}

}  // namespace minidl::parallel
