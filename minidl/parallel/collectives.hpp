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
//                           (reduction_tree.hpp), in place: the same bits on every rank; with
//                           `by_node`, the joins inside a node run in shared memory first
//   hierarchical_allreduce  y = sum over ranks of scale * x, in place: summed in each node's
//                           shared memory, allreduced among the node leaders, read by every rank
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
/// by_node: the ranks of a node (Communicator::split_shared(ranks_per_node)) join what the tree
/// joins among them in shared memory, and only their node's parts cross to other nodes; the
/// same bits as without.
ir::Value* tree_allreduce(ir::Value* x, std::int64_t leaves, int group = 0,
                          const std::string& name = {}, bool by_node = false,
                          int ranks_per_node = 0);

/// y = sum over the ranks of group `group` of (scale * x), in place, in two levels: the ranks of
/// a node (Communicator::split_shared(ranks_per_node)) sum in the node's shared memory, each rank
/// a slice of every rank's x; the node leaders allreduce the node sums; every rank reads the
/// result from its node's shared memory. Blocking.
ir::Value* hierarchical_allreduce(ir::Value* x, double scale, int group = 0, int ranks_per_node = 0,
                                  const std::string& name = {});

/// What a hierarchical_allreduce node does, for n floats outside a graph.
class NodeAllreduce {
 public:
  NodeAllreduce(const Communicator::SharedSplit& split, std::int64_t n, float scale);
  void operator()(float* x);

 private:
  const Communicator::SharedSplit& split_;
  std::int64_t n_;
  float scale_;
};

/// What a tree_allreduce node does, for n floats outside a graph: x, this rank's subtree of the
/// tree over `leaves` micro-shards, becomes the tree's root on every rank (the same bits).
class TreeAllreduce {
 public:
  /// Throws minidl::Error when leaves < comm.size(). With split (comm's split_shared()), the
  /// ranks of a node join their parts in the node's shared memory first (see tree_allreduce).
  TreeAllreduce(Communicator& comm, std::int64_t leaves, std::int64_t n,
                const Communicator::SharedSplit* split = nullptr);
  void operator()(float* x);

 private:
  void by_node(float* x);
  /// The node plan, on the first call (collective): which joins run inside this node, which
  /// parts every node hands to the leaders, and which joins the gathered parts need.
  void plan_nodes();

  Communicator& comm_;
  std::int64_t n_;
  std::vector<std::pair<int, int>> joins_;
  std::vector<float> parts_;
  const Communicator::SharedSplit* split_ = nullptr;
  bool planned_ = false;
  std::vector<int> local_of_;                      // per rank: its rank inside its node
  std::vector<std::pair<int, int>> local_joins_;   // this node's joins, as ranks
  std::vector<int> exported_;                      // this node's parts for the leaders, as ranks
  std::vector<std::int64_t> gathered_at_;          // per rank: its part's slot among the gathered
  std::vector<std::pair<int, int>> global_joins_;  // the rest, as ranks
  std::int64_t most_exported_ = 0;                 // most parts any node exports
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
