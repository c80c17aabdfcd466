// Thread replicas: data parallelism inside one process, as the reports' OpenMP versions do it,
// but without their critical sections. The trainer builds the forward once per replica, each on
// its own slice of the local batch (its inputs carry replica r, ir::Node::replica), and
// differentiates the share-weighted sum of the replicas' losses; autograd then sums each
// parameter's gradient over the replicas. This pass makes that a parallel program:
//
//   - each cross_replica_sum (ops/reduce/cross_replica_sum.cpp) written once per replica becomes
//     one sum over the replicas, read by all of them (the k-th copy with a key in one replica
//     matches the k-th in every other);
//   - every node is classified by the replica inputs it depends on: one replica r (given
//     replica r), none (shared work such as the loss seed), or several (the gradient sums,
//     the updates and what follows), and by its level: the number of cross-replica sums on the
//     longest path to it (a sum's output depends on no replica again);
//   - each sum over the replicas becomes a balanced tree of adds, its leaves in replica order,
//     so the reduction order is fixed and written in the graph;
//   - the nodes are reordered level by level: the level's shared work, its replica nodes, the
//     nodes joining several replicas; the optimizer's updates last. The runtime runs each
//     level's replica nodes as one parallel section, replica r on OpenMP thread r, each into its
//     own buffers (see Executable). Without cross-replica sums there is one level: shared work,
//     the replicas' nodes, the rest.
#pragma once

#include "minidl/ir/pass.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl::parallel {

class ThreadReplicas final : public ir::Pass {
 public:
  std::string_view name() const override { return "thread-replicas"; }
  std::vector<std::string> needs() const override { return {"differentiated"}; }
  std::vector<std::string> provides() const override { return {"replicas-scheduled"}; }
  bool run(ir::Graph& g) override;
};

}  // namespace minidl::parallel
