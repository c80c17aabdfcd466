// Sums over the replicas of a step (ops/reduce/cross_replica_sum.cpp) across ranks, and
// --sync-bn.
//
// A model writes cross_replica_sum(x, key) in its forward (BatchNorm: its per-channel sums, for
// the running statistics); autograd writes one for its gradient. The thread-replicas pass joins
// a rank's replica copies into one node over the rank's replicas; this pass then reduces that
// node's value across the ranks: an allreduce (sum), or in deterministic mode a tree_allreduce
// over the micro-shards, so the sum has the bits of the one-process run's (the rank's replicas
// hold its subtree, joined by the same halving rule). Every rank then reads the sum of the whole
// global batch.
#pragma once

#include <cstdint>

#include "minidl/ir/pass.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

class CrossReplicaSums final : public ir::Pass {
 public:
  /// tree_leaves > 0: deterministic mode, the number of micro-shards of the batch the graph
  /// runs (at least the rank count); 0: MPI's allreduce.
  CrossReplicaSums(Communicator& comm, std::int64_t tree_leaves);
  std::string_view name() const override { return "cross-replica-sums"; }
  /// After the thread replicas' joins, so each rank holds one value per sum.
  std::vector<std::string> needs() const override { return {"replicas-scheduled"}; }
  std::vector<std::string> provides() const override { return {"cross-replica-sums-reduced"}; }
  bool run(ir::Graph& g) override;

 private:
  Communicator& comm_;
  std::int64_t tree_leaves_;
};

/// --sync-bn, on a forward graph before autograd: every other reader of a value that the model
/// sums across replicas (cross_replica_sum) reads the sum instead, so statistics the model
/// computes per replica (BatchNorm's per-channel sums) become those of the global batch, and
/// autograd differentiates through the sum. Returns how many values it redirected.
int use_global_statistics(ir::Graph& g);

}  // namespace minidl::parallel
