// Tensor (model) parallelism, Megatron's pattern: the ranks of a job are laid out as
// data-parallel replicas x tensor-parallel shards (rank r is shard r % T of replica r / T). The
// shards of one replica share its samples and split the weights of matmul pairs between them;
// four collective ops over the shards' communicator carry activations and gradients, each
// differentiated by its transposed collective:
//
//   tp_copy(x)     y = x                                      backward: tp_reduce
//   tp_reduce(x)   y = sum over the shards of x               backward: tp_copy
//   tp_scatter(x)  y = this shard's part of x along `axis`    backward: tp_gather
//   tp_gather(x)   y = every shard's x joined along `axis`    backward: tp_scatter
//
// tp_reduce gathers the shards' partial sums and adds them in shard order on every rank, never
// in MPI's order, so its bits depend on nothing but the shard count.
//
// split_matmul_pairs rewrites a graph's forward: a Linear (matmul with a weight [out, in],
// optional bias, optional elementwise activation) followed by another Linear reading only its
// output becomes a column-parallel Linear (this shard's rows of the first weight and bias) and
// a row-parallel one (this shard's columns of the second weight), between tp_copy of the input
// and tp_reduce of the partial products, before the second bias: one collective in the forward
// and one in the backward per pair. Each rank stores only its parts of the split parameters
// (train::ParameterShard): a graph reads such a parameter whole through tp_gather of its part,
// and the rewrite reads the part itself instead, so the parts are what the graph
// differentiates and the optimizer updates, and no step gathers a parameter.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "minidl/core/tensor.hpp"
#include "minidl/ir/graph.hpp"
#include "minidl/ir/pass.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

ir::Value* tp_copy(ir::Value* x, int group, const std::string& name = {});
ir::Value* tp_reduce(ir::Value* x, int group, const std::string& name = {});
ir::Value* tp_scatter(ir::Value* x, int axis, int group, const std::string& name = {});
ir::Value* tp_gather(ir::Value* x, int axis, int group, const std::string& name = {});

struct TensorParallelOptions {
  int shards = 1;  // T
  int rank = 0;    // this rank's shard
  int group = 0;   // the shards' communicator (register_group)
};

/// A parameter's piece on this shard: its rows (axis 0) or columns (axis 1).
struct TensorParallelPiece {
  std::string name;
  ir::Value* param = nullptr;  // the parameter as the model's graph read it (whole)
  ir::Value* piece = nullptr;  // the parameter holding this shard's part: read by the split pair
  int axis = 0;
};

struct TensorParallelPlan {
  std::vector<TensorParallelPiece> pieces;
  std::vector<std::string> pairs;  // "fc1.matmul + fc2.matmul", one per split pair
  /// The pieces' value for param (or param itself when it is not split).
  ir::Value* piece_of(ir::Value* param) const;
};

/// A parameter the rewrite splits, and the axis along which each shard takes its part.
struct SplitParameter {
  std::string name;
  int axis = 0;
};
/// The parameters split_matmul_pairs would split in g (which it leaves as it is), each once.
/// Throws as split_matmul_pairs does.
std::vector<SplitParameter> plan_split(ir::Graph& g, int shards);

/// Rewrites every pair of matmul Linears in g's forward (before autograd) as described above.
/// Throws minidl::Error naming the layer when a pair's hidden width does not split into
/// `shards` equal parts, when g holds no pair at all, and, with more than one shard, naming the
/// parameter when one to split is not stored as this shard's part along the split's axis.
TensorParallelPlan split_matmul_pairs(ir::Graph& g, const TensorParallelOptions& o);

/// split_matmul_pairs as a pass (`tensor-parallel`), run on a training graph's forward before
/// autograd, so the verifier checks it and MINIDL_DUMP_AFTER=tensor-parallel prints its result.
class TensorParallel final : public ir::Pass {
 public:
  explicit TensorParallel(TensorParallelOptions options) : options_(options) {}
  std::string_view name() const override { return "tensor-parallel"; }
  std::vector<std::string> needs() const override { return {}; }
  std::vector<std::string> provides() const override { return {"tensor-parallel-split"}; }
  bool run(ir::Graph& g) override {
    plan_ = split_matmul_pairs(g, options_);
    return true;
  }
  /// The last run's pieces.
  const TensorParallelPlan& plan() const { return plan_; }

 private:
  TensorParallelOptions options_;
  TensorParallelPlan plan_;
};

/// The axis along which piece is a part of whole (the one dimension in which they differ; -1
/// when the shapes are equal). Throws when they differ otherwise.
int piece_axis(const Shape& whole, const Shape& piece);
/// Shard `rank` of `shards`' part of whole along the axis where `piece` differs (a copy).
Tensor take_piece(const Tensor& whole, const Shape& piece, int rank, int shards);
/// The whole tensor of shape `whole` from every shard's piece (collective over comm, the
/// shards in rank order).
Tensor gather_pieces(Communicator& comm, const Tensor& piece, const Shape& whole);

/// The communicators of a replicas x shards layout of `world`. Made without communicating (the
/// ranks and sizes follow from the layout), so a run can be configured before its preflight;
/// connect() then splits world (collective) and the two communicators may be used.
class TensorParallelComms {
 public:
  /// Throws minidl::Error unless `shards` >= 1 divides world's size.
  TensorParallelComms(Communicator& world, int shards);
  ~TensorParallelComms();
  void connect();
  /// The replicas of this rank's shard: ranks s, s + T, s + 2T, ...
  Communicator& data() { return *data_; }
  /// The shards of this rank's replica: ranks T r .. T r + T - 1.
  Communicator& tensor() { return *tensor_; }
  int shards() const { return shards_; }

 private:
  Communicator& world_;
  int shards_;
  std::unique_ptr<Communicator> data_, tensor_;
};

}  // namespace minidl::parallel
