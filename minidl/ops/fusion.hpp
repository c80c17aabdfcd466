// Fusion passes. FuseBiasActivation folds a bias_add and a following relu into the op that produces
// their input, when that op can do the work in its own store (matmul: the GEMM epilogue or oneDNN's
// bias and post-op; conv2d likewise; max_pool2d the relu only). A fusable op declares it: it has
// the string attribute "activation", and, to take the bias_add too, its last input is the optional
// "bias". The pass runs on the training graph after
// autograd, so nothing differentiates a fused node: the backward already reads what it needs
// (relu_bwd the relu's output, which the fused node now produces; bias_add_bwd only the output
// gradient).
#pragma once

#include "minidl/ir/pass.hpp"

namespace minidl::ops {

/// producer -> bias_add -> relu becomes one producer node with a bias input and
/// activation=relu; producer -> bias_add and producer -> relu fuse alike. Only chains whose
/// intermediate values have no other reader and are not graph outputs are folded. The fused node
/// takes the producer's name and annotations and records what it absorbed in the annotation
/// "fused" (shown by the graph printer).
class FuseBiasActivation final : public ir::Pass {
 public:
  /// enabled false (--no-fuse): the pass leaves the graph alone; the fact it provides (fusion
  /// decided) holds either way.
  explicit FuseBiasActivation(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-bias-activation"; }
  std::vector<std::string> provides() const override { return {"bias-activation-fused"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// A plain SGD update whose gradient comes straight from a matmul (a linear layer's weight
/// gradient on one replica; data-parallel graphs reduce it first and do not match) becomes one
/// matmul_accumulate node that adds -lr times the product into the parameter: the gradient is
/// never written and read back: two passes over weight-sized memory instead of four. Only updates
/// without weight decay fuse, and only gradients with no other reader that are not graph outputs;
/// a product that computes in bf16 (ir::node_precision) stays unfused, since matmul_accumulate
/// has no bf16 kernel.
/// The fused node takes the update's place and annotations, is named "<matmul>+sgd", and records
/// the update in the annotation "fused". The result changes only by rounding: the GEMM's store
/// computes p + (-1 * lr) * acc, the update p - lr * g; lr stays the graph's learning-rate input.
class FuseUpdateIntoProduct final : public ir::Pass {
 public:
  /// enabled false: no change (--no-fuse, deterministic mode's elementwise updates).
  explicit FuseUpdateIntoProduct(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-update-into-product"; }
  /// Reduced or clipped gradients must never fold into their product: it runs after both.
  std::vector<std::string> needs() const override {
    return {"gradients-reduced", "gradients-clipped"};
  }
  std::vector<std::string> provides() const override { return {"updates-fused"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// In training graphs after autograd: BatchNorm's input gradient, composed by autograd as
/// add(batch_norm_bwd(dy, x, mean, var, w).dx, bn_stats_bwd(x, dstats)) (either order; the same x),
/// becomes one batch_norm_bwd_data(dy, x, var, dstats, w) node, and the batch_norm_bwd a
/// batch_norm_bwd_reduce giving only dweight, dbias, dmean and dvar: two passes over the
/// activation-sized tensors instead of four (ops/nn/batch_norm.cpp). The dstats may come through a
/// cross_replica_sum (--sync-bn); only a dx and a bn_stats_bwd output read by nothing but the add
/// (and not graph outputs) match. The data node takes the add's place and annotations and records
/// the absorbed nodes in "fused"; the result is the unfused native kernels' bits, and the
/// reductions are the native kernel's (double, independent of the thread count).
class FuseBatchNormBackward final : public ir::Pass {
 public:
  explicit FuseBatchNormBackward(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-batch-norm-backward"; }
  std::vector<std::string> needs() const override { return {"differentiated"}; }
  std::vector<std::string> provides() const override { return {"batch-norm-backward-fused"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// In evaluation graphs: conv2d (activation none) whose only reader is a batch_norm with fixed
/// statistics (mean, var, weight and bias all bound storage: the running statistics) becomes one
/// conv2d on folded weights and bias, which a fold_batch_norm node computes from the originals
/// every run (ops/nn/fold_batch_norm.cpp). A relu that is the batch_norm's only reader folds in
/// as the convolution's activation. Training graphs never match: their batch_norm reads the
/// batch's statistics, computed from the convolution's output. The result changes only by
/// rounding.
class FoldBatchNorm final : public ir::Pass {
 public:
  explicit FoldBatchNorm(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fold-batch-norm"; }
  std::vector<std::string> provides() const override { return {"batch-norm-folded"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

}  // namespace minidl::ops
