// Collective ops: ordinary IR ops (schema, shape rule, kernel, test) whose kernels call the
// communicator, so a graph dump shows exactly where and in which order gradients are reduced.
// Each names its communicator by a group id (see register_group). All are side effects: a peer
// waits for them, so dead-code elimination must never drop one.
//
//   allreduce(x)            y = sum over ranks of scale * x, in place
//   reduce(x)               the same on rank `root` only; the other ranks keep scale * x
//   broadcast(x)            root's x on every rank, in place
//   allgather(x)            [ranks * d0, ...]: every rank's x in rank order
//   tree_allreduce(x)       y = the ranks' x joined in the fixed tree over `leaves` micro-shards
//                           (reduction_tree.hpp), in place: the same bits on every rank
//   allreduce_start(x)      starts an in-place allreduce: (in_flight, request); only the matching
//   allreduce_wait(..)      wait may read them. The wait's output, in place, is the sum.
//   send(x) / recv()        point to point, blocking; recv's shape and dtype are attributes
//   bucket_pack(b, x)       copies x into the flat bucket b at `offset`, in place
//   bucket_unpack(b)        copies `shape` elements from `offset` of b (read flat) out
//   comm_progress()         lets pending non-blocking collectives of the group advance
#pragma once

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

/// Adds the ops of parallel/ (op_table(), generated from their MINIDL_OP lines) to the op table,
/// so that ops::op("allreduce") finds them; once, later calls do nothing. Building a node needs
/// no lookup (the builders below name the ops by their objects, op_allreduce, ...) but calls it,
/// so only code that looks a collective up by name before building one calls it itself.
void register_ops();

/// y = sum over the ranks of group `group` of (scale * x), written in place into x's buffer.
ir::Value* allreduce(ir::Value* x, double scale, int group = 0, const std::string& name = {});
/// Sum of scale * x over the ranks, on rank root; in place.
ir::Value* reduce(ir::Value* x, double scale, int root, int group = 0,
                  const std::string& name = {});
/// Root's x on every rank; in place.
ir::Value* broadcast(ir::Value* x, int root, int group = 0, const std::string& name = {});
/// Every rank's x, concatenated along dimension 0 in rank order.
ir::Value* allgather(ir::Value* x, int group = 0, const std::string& name = {});

/// Deterministic sum over the ranks: x is this rank's subtree of the tree over `leaves`
/// micro-shards (its range from tree_owners(leaves, ranks)); every rank gathers all parts and
/// joins them in the tree's order. In place; needs leaves >= ranks.
ir::Value* tree_allreduce(ir::Value* x, std::int64_t leaves, int group = 0,
                          const std::string& name = {});

/// What a tree_allreduce node does, for n floats outside a graph: x, this rank's subtree of the
/// tree over `leaves` micro-shards, becomes the tree's root on every rank (the same bits).
class TreeAllreduce {
 public:
  /// Throws minidl::Error when leaves < comm.size().
  TreeAllreduce(Communicator& comm, std::int64_t leaves, std::int64_t n);
  void operator()(float* x);

 private:
  Communicator& comm_;
  std::int64_t n_;
  std::vector<std::pair<int, int>> joins_;
  std::vector<float> parts_;
};

/// The two outputs of allreduce_start: the buffer in flight and the request to wait for.
struct InFlight {
  ir::Value* data = nullptr;
  ir::Value* request = nullptr;
};
InFlight allreduce_start(ir::Value* x, double scale, int group = 0, const std::string& name = {});
/// The reduced value; in place of the in-flight buffer.
ir::Value* allreduce_wait(InFlight f, const std::string& name = {});

ir::Node* send(ir::Value* x, int peer, int tag, int group = 0, const std::string& name = {});
ir::Value* recv(ir::Graph& g, const Shape& shape, DType dtype, int peer, int tag, int group = 0,
                const std::string& name = {});

ir::Value* bucket_pack(ir::Value* bucket, ir::Value* x, std::int64_t offset,
                       const std::string& name = {});
ir::Value* bucket_unpack(ir::Value* bucket, std::int64_t offset, const Shape& shape,
                         const std::string& name = {});
ir::Node* comm_progress(ir::Graph& g, int group = 0, const std::string& name = {});

}  // namespace minidl::parallel
