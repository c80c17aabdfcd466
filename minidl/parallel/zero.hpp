// ZeRO stages 1 and 2: sharded optimizer state (and gradients) over the data-parallel ranks.
// The parameters are laid end to end in one flat space (ZeroPlan), cut into one contiguous
// shard per rank. A step then gives each rank the sum of its shard only, reducing each gradient
// where the backward left it (stage 1: the gradient is allreduced in place, each rank reads its
// pieces; stage 2: zero_scatter_into, whose reduce-scatter writes the rank's part into its
// shard), each rank updates the pieces of the parameters in its shard with optimizer state for
// those pieces only, and zero_gather_into all-gathers every parameter's parts straight into its
// storage. No buffer of the whole model's size is added: only the shard's.
//
// Shards are cut at the boundaries of the chunks in which a gradient's squared norm is summed
// (ops::fixed_order_chunk): each chunk's partial sum is then computed by one rank, and
// shard_sum_squares combines them in the replicated run's order, so the clipping norm has the
// same bits as without sharding. In deterministic mode zero_allreduce_into and
// zero_scatter_into (and the whole-buffer reduce_scatter) join the ranks' parts in the fixed
// tree (reduction_tree.hpp), so the parameters have the same bits as replicated training on any
// number of ranks.
//
//   reduce_scatter(x [N])       y [shard]: this rank's part of the sum over ranks of x
//   allgatherv(x [shard])       y [N]: every rank's shard, in rank order
//   zero_scatter_into(shard, x) shard, in place: x (a parameter's gradient, at `offset` in the
//                               flat space) summed over the ranks, this rank's part written at
//                               its place in the shard
//   zero_allreduce_into(shard, x)
//                               shard, x: x summed over the ranks in place, this rank's part
//                               copied to its place in the shard
//   zero_gather_into(p, shard)  p, in place: every rank's part of parameter p, from its shard
//   shard_sum_squares(x)        [] f32: the squared norm of all gradients, from the shards
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/layout.hpp"

namespace minidl::parallel {

/// The flat space of the parameters and its shards.
struct ZeroPlan {
  std::vector<std::string> names;     // the parameters, in the flat order
  std::vector<Shape> shapes;          // their shapes
  std::vector<std::int64_t> offsets;  // parameter i is [offsets[i], offsets[i + 1])
  std::vector<std::int64_t> bounds;   // rank r's shard is [bounds[r], bounds[r + 1])

  /// Cuts the parameters (in this order) into `ranks` contiguous shards of near-equal size, at
  /// norm-chunk boundaries. Throws minidl::Error when there are fewer chunks than ranks.
  static ZeroPlan make(const std::vector<std::pair<std::string, Shape>>& params, int ranks);
  int ranks() const { return static_cast<int>(bounds.size()) - 1; }
  std::int64_t total() const { return offsets.back(); }
  std::int64_t shard_size(int rank) const { return bounds[rank + 1] - bounds[rank]; }
  /// The elements of parameter i in rank r's shard, relative to the parameter's start (empty
  /// when begin == end).
  Slice piece(std::size_t i, int rank) const;
  /// The parameter's index, or -1.
  int index(const std::string& name) const;
};

struct ZeroOptions {
  int stage = 1;  // 1: optimizer state sharded; 2: gradients too
  int rank = 0;   // the rank the graph is built for
  int group = 0;  // the data-parallel ranks' communicator (register_group)
  /// Deterministic mode: the gradients are the ranks' subtrees of the tree over this many
  /// micro-shards, joined in its order; 0: MPI's sum.
  std::int64_t tree_leaves = 0;
  /// The gradients are the sum over the ranks already (deterministic gradient accumulation,
  /// whose micro-steps the tree joins across the ranks as they end): each rank takes its shard
  /// and nothing is communicated.
  bool reduced = false;
};

/// What a rank updates: a copy of each piece of a parameter in its shard and the reduced
/// gradient of that piece, in the flat order.
struct ZeroPieces {
  std::vector<std::string> names;  // the parameters the pieces belong to
  std::vector<std::size_t> index;  // their indices in the plan
  std::vector<ir::Value*> params, grads;
  ir::Value* shard = nullptr;  // this rank's shard of the reduced gradients [shard_size]
};

/// Adds the gradients' reduction: grads[i] is the gradient of params[i] (parameter nodes,
/// every one of the plan, in any order). Returns this rank's pieces, for the optimizer.
ZeroPieces zero_reduce_gradients(ir::Graph& g, const ZeroPlan& plan, const ZeroOptions& o,
                                 const std::vector<ir::Value*>& params,
                                 const std::vector<ir::Value*>& grads);

/// The global squared norm of the gradients ([] f32, the same on every rank) from this rank's
/// pieces, the parameters' sums added in the order of `order` (the plan's indices of the
/// parameters in update order), as clip-grad-norm adds them.
ir::Value* zero_sum_squares(ir::Graph& g, const ZeroPlan& plan, const ZeroOptions& o,
                            const ZeroPieces& pieces, const std::vector<std::size_t>& order);

/// Adds the all-gather of the updated pieces into the parameters: updated[k] is the new value
/// of pieces.params[k]; params as for zero_reduce_gradients.
void zero_gather_parameters(ir::Graph& g, const ZeroPlan& plan, const ZeroOptions& o,
                            const ZeroPieces& pieces, const std::vector<ir::Value*>& updated,
                            const std::vector<ir::Value*>& params);

}  // namespace minidl::parallel
