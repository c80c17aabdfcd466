// The data-parallel pass: every rank runs the same training graph on its share of the global
// batch; the pass inserts the reduction of every parameter gradient, weighted by the rank's
// share, so every optimizer update sees the gradient of the global batch and all ranks keep
// identical parameters. The schedule is explicit in the graph: which gradients share a bucket,
// which collectives reduce it, and where each runs (node order is execution order).
#pragma once

#include <string>
#include <string_view>

#include "minidl/ir/pass.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

enum class ReduceStrategy {
  Allreduce,  // every rank: allreduce of each bucket
  Root,       // reduce to rank 0, every rank updates, rank 0's parameters are broadcast
  // Two levels: the ranks of a node sum in shared memory, the node leaders allreduce (with
  // overlap: node-local reduce to the leader, non-blocking allreduce among leaders, node
  // broadcast).
  Hierarchical,
  // Deterministic: each rank holds the sum over its subtree of micro-shards, already weighted;
  // the parts are joined in the fixed tree of reduction_tree.hpp (tree_allreduce), so the sum
  // has the same bits for any number of ranks. Blocking only.
  Tree,
};
std::string_view reduce_strategy_name(ReduceStrategy s);
/// "allreduce", "root", "hierarchical" or "tree"; anything else fails naming the allowed values.
ReduceStrategy parse_reduce_strategy(std::string_view s);

/// Pipeline and tensor (model) parallelism: which part of the model a node belongs to. Nodes
/// carry optional int annotations "stage" (pipeline stage) and "shard" (tensor-parallel shard),
/// default 0; ranks are laid out as replicas x shards (parallel/tensor_parallel.hpp), and the
/// gradients of a rank's graph are reduced over the communicator the pass is given: the
/// replicas of its shard. With pipeline stages each graph holds one stage (the step compiler
/// cuts them: train/pipeline.hpp) and the communicator is that stage's replicas; the pass
/// refuses a graph whose nodes lie in several stages, and stages and shards together.
struct Partition {
  int stages = 1;
  int shards = 1;
  bool trivial() const { return stages == 1 && shards == 1; }
};
int stage_of(const ir::Node& n);
int shard_of(const ir::Node& n);
void set_stage(ir::Node& n, int stage);
void set_shard(ir::Node& n, int shard);

struct DataParallelOptions {
  ReduceStrategy strategy = ReduceStrategy::Allreduce;
  /// Gradients are packed, in the order they become final during backward, into buckets of at
  /// most this many bytes (a larger gradient gets a bucket of its own); one collective per
  /// bucket. 0: one collective per gradient, in place, no packing.
  std::int64_t bucket_bytes = 256 * 1024;
  /// On: each bucket's reduction starts right after its last gradient is produced
  /// (allreduce_start, non-blocking) and is waited for right before the first update that needs
  /// it. Off: blocking collectives after the whole backward. Off by default: on one machine the
  /// transfers and sums are work for the same cores that run the backward, and overlapping did
  /// not shorten a step there (see docs/performance.md, "Overlapping the gradient reduction").
  bool overlap = false;
  /// With overlap: a comm_progress node after every node between the first start and the last
  /// wait, since OpenMPI advances a non-blocking collective only inside MPI calls.
  bool progress = true;
  /// Tree: the micro-shards of the global batch (the tree's leaves); at least the rank count.
  std::int64_t tree_leaves = 0;
  /// Tree: the ranks of a node join their parts in shared memory first, then the nodes' parts
  /// are joined (tree_allreduce's by_node); the same bits.
  bool tree_by_node = false;
  /// Hierarchical, and Tree by node: ranks per (pretended) node, see
  /// Communicator::split_shared.
  int ranks_per_node = 0;
  Partition partition;
};

class DataParallel final : public ir::Pass {
 public:
  /// share: this rank's fraction of the global batch (local samples / global samples), by which
  /// its gradients are scaled (not with the tree strategy, whose gradients come weighted). With
  /// several ranks this splits comm into nodes (collective, once per communicator) whatever the
  /// strategy, so a rank configured differently fails in preflight instead of hanging here.
  DataParallel(Communicator& comm, double share, DataParallelOptions options = {});
  std::string_view name() const override { return "data-parallel"; }
  /// After the thread replicas' sums (it reduces their result, and never splits a section).
  std::vector<std::string> needs() const override { return {"replicas-scheduled"}; }
  std::vector<std::string> provides() const override { return {"gradients-reduced"}; }
  /// Reduces the gradient input of every optimizer update (OpDef::update_role); refuses a node
  /// that writes a parameter in place without that role.
  bool run(ir::Graph& g) override;
  /// The last run's schedule, one line per bucket: its collectives and gradients in order.
  const std::string& schedule() const { return schedule_; }

 private:
  Communicator& comm_;
  int group_;
  double share_;
  DataParallelOptions options_;
  std::string schedule_;
};

}  // namespace minidl::parallel
