// Thread replicas: data parallelism inside one process, as the reports' OpenMP versions do it,
// but without their critical sections. The trainer builds the forward once per replica, each on
// its own slice of the local batch (its inputs carry replica r, ir::Node::replica), and
// differentiates the share-weighted sum of the replicas' losses; autograd then sums each
// parameter's gradient over the replicas. This pass makes that a parallel program:
//
//   - every node is classified by the replica inputs it depends on: one replica r (given
//     replica r), none (shared work such as the loss seed), or several (the gradient sums,
//     the updates and what follows);
//   - each gradient sum over the replicas becomes a balanced tree of adds, its leaves in replica
//     order, so the reduction order is fixed and written in the graph;
//   - the nodes are reordered (stably, which keeps dependencies): shared work first, then all
//     replica nodes together, then the rest. The runtime runs that middle run as one parallel
//     section, replica r on OpenMP thread r, each into its own buffers (see Executable).
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
