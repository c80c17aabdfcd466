#include "minidl/parallel/cross_replica_sums.hpp"

#include <algorithm>

#include "minidl/ops/op_table.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/data_parallel.hpp"

namespace minidl::parallel {

CrossReplicaSums::CrossReplicaSums(Communicator& comm, std::int64_t tree_leaves)
    : comm_(comm), tree_leaves_(tree_leaves) {}

bool CrossReplicaSums::run(ir::Graph& g) {
  if (comm_.size() < 2) return false;
  std::vector<ir::Node*> sums;
  for (ir::Node* n : g.nodes())
    if (&n->def() == &ops::op_cross_replica_sum) sums.push_back(n);
  // Over this pass's communicator: the job's ranks, or a pipeline stage's data-parallel
  // replicas (each stage sums its own samples' statistics, as its gradients).
  const int group = register_group(&comm_);
  for (ir::Node* n : sums) {
    MINIDL_CHECK(n->replica() < 0, n->describe(), " still belongs to replica ", n->replica(),
                 ": the thread-replicas pass joins the replicas' sums first");
    // The node's copy is reduced in place; its readers read the reduced value.
    ir::Value* v = n->output();
    const std::string name = n->name() + (tree_leaves_ > 0 ? ".tree_allreduce" : ".allreduce");
    ir::Value* reduced = tree_leaves_ > 0 ? tree_allreduce(v, tree_leaves_, group, name)
                                          : allreduce(v, 1.0, group, name);
    ir::Node* c = reduced->producer();
    c->set_phase(ir::Phase::Communication);
    if (n->annotations().find("stage") != nullptr) set_stage(*c, stage_of(*n));
    g.replace_uses(v, reduced, c);
    // Right after the sum: the order stays valid, and the replicas wait no longer than needed.
    const auto& order = g.nodes();
    const auto it = std::find(order.begin(), order.end(), n);
    if (it + 1 != order.end() && *(it + 1) != c) g.move_before(c, *(it + 1));
  }
  return !sums.empty();
}

int use_global_statistics(ir::Graph& g) {
  int redirected = 0;
  std::vector<ir::Node*> sums;
  for (ir::Node* n : g.nodes())
    if (&n->def() == &ops::op_cross_replica_sum) sums.push_back(n);
  for (ir::Node* n : sums) {
    ir::Value* local = n->input(0);
    if (local->users().size() < 2) continue;
    // Right after the local value, so every reader comes after the sum.
    const auto& order = g.nodes();
    const auto after = std::find(order.begin(), order.end(), local->producer()) + 1;
    if (*after != n) g.move_before(n, *after);
    g.replace_uses(local, n->output(), n);
    ++redirected;
  }
  return redirected;
}

}  // namespace minidl::parallel
