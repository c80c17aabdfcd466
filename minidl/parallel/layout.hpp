// Layout: how one global batch (the samples of one optimizer step) maps onto micro-steps run
// one after another (gradient accumulation) x ranks x thread replicas x micro-shards. The step
// compiler builds each rank's graphs from it, the training loop feeds each rank its share from
// it, and deterministic mode is one of its properties (micro-shards summed in the fixed tree of
// reduction_tree.hpp) rather than a branch of the loop. With tensor-parallel shards, `ranks`
// counts the data-parallel replicas: each replica's samples go to all of its shards
// (parallel/tensor_parallel.hpp). Pipeline stages are not described here but by
// train::StepOptions::pipeline (its micro-batches are this layout's replicas): `stages` stays 1.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace minidl::parallel {

/// Samples [begin, end) of a batch.
struct Slice {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

struct LayoutOptions {
  int ranks = 1;
  /// Thread replicas per rank (parallel::ThreadReplicas); 1: one graph, kernels parallel inside.
  int replicas = 1;
  /// Deterministic when > 0: samples per micro-shard. Every global batch is cut into
  /// micro-shards, each computed as a replica of its own on one thread wherever it runs, and
  /// their gradients are summed in one fixed tree (ranks own subtrees), so the parameters have
  /// the same bits for any ranks x threads. `replicas` then does not apply.
  std::int64_t micro_batch = 0;
  /// Gradient accumulation: micro-steps per global batch, run one after another, their
  /// gradients summed before the one update. In deterministic mode every micro-step is a
  /// subtree of the batch's reduction tree and the sums follow the tree, so the bits equal those
  /// of the whole batch in one step.
  std::int64_t accumulate = 1;
  int stages = 1;  // must be 1: pipeline stages live in train::StepOptions::pipeline
  int shards = 1;  // tensor-parallel shards of every replica (ranks x shards processes in all)
};

class Layout {
 public:
  /// Checks the options (positive counts; `stages` 1).
  explicit Layout(LayoutOptions options = {});
  const LayoutOptions& options() const { return options_; }
  int ranks() const { return options_.ranks; }
  bool deterministic() const { return options_.micro_batch > 0; }
  std::int64_t micro_batch() const { return options_.micro_batch; }

  std::int64_t accumulate() const { return options_.accumulate; }

  /// Micro-shards in a global batch of n samples (deterministic mode).
  std::int64_t micro_shards(std::int64_t n) const;
  /// The micro-steps of a global batch of n >= ranks samples, in sample order, each giving
  /// every rank at least one sample (deterministic: one micro-shard). Without accumulation one,
  /// the whole batch; otherwise up to `accumulate` near-equal parts, or in deterministic mode
  /// the nodes of the reduction tree found by splitting it from the root while a node holds
  /// more than 1/accumulate of the leaves and both its children can still feed every rank
  /// (a power-of-two `accumulate` then gives equal micro-steps).
  std::vector<Slice> micro_steps(std::int64_t n) const;
  /// The order in which the micro-steps' gradients are summed: after micro-step j's gradient
  /// is pushed on a stack, joins[j] times the top two entries are replaced by their sum. In
  /// arrival order ({0, 1, 1, ...}), or in deterministic mode the reduction tree's order above
  /// the micro-steps (children before parents), so the sum is the tree's root.
  std::vector<int> micro_step_joins(std::int64_t n) const;
  /// Rank `rank`'s share of a global batch of n samples: an equal split (the first n % ranks
  /// ranks one sample more), or in deterministic mode the micro-shards of its subtree.
  Slice share(int rank, std::int64_t n) const;
  /// How a rank's share of `local` samples splits into replicas, relative to the share's start:
  /// `replicas` near-equal slices (at most one per sample), or in deterministic mode its
  /// micro-shards. Evaluation (train false) is one slice.
  std::vector<Slice> replicas(std::int64_t local, bool train) const;
  /// Whether the rank's graph runs its replicas as parallel sections (thread replicas, or
  /// deterministic mode: each micro-shard on one thread).
  bool sections(std::int64_t local, bool train) const;
  /// Throws minidl::Error unless a global batch of n samples gives every rank at least one
  /// sample (deterministic: one micro-shard); `what` names the batch ("the last batch").
  void check_batch(std::int64_t n, const std::string& what) const;
  /// "2 rank(s) x 2 replica(s)", "1 rank(s), deterministic: micro-batch 8".
  std::string describe() const;

 private:
  LayoutOptions options_;
};

}  // namespace minidl::parallel
