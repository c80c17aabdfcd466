// Fusion passes. FuseBiasActivation folds a bias_add and a following relu into the op that produces
// their input, when that op can do the work in its own store (matmul: the GEMM epilogue or oneDNN's
// bias and post-op; conv2d likewise; batch_norm and add apply the relu in their own pass,
// max_pool2d to its output). An op declares what it takes: a relu, by the string attribute
// "activation"; a bias_add, by an optional last input "bias". The pass runs on the training graph
// after autograd, so nothing differentiates a fused node: the backward already reads what it
// needs (relu_bwd the relu's output, which the fused node now produces; bias_add_bwd only the
// output gradient). FuseActivationBackward then moves the relu_bwd's mask into the backward ops
// that read its result, where they take it.
#pragma once

#include "minidl/ir/pass.hpp"

namespace minidl::ops {

/// producer -> bias_add -> relu becomes one producer node with a bias input and
/// activation=relu; producer -> bias_add and producer -> relu fuse alike. A bias_add folds into a
/// producer whose inputs stop just before its optional last input "bias"; a relu into one whose
/// "activation" is none (matmul, conv2d, batch_norm, add). Only chains whose intermediate values
/// have no other reader and are not graph outputs are folded. The fused node takes the
/// producer's name and annotations and records what it absorbed in the annotation "fused" (shown
/// by the graph printer).
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

/// An SGD update whose gradient comes straight from a matmul (a linear layer's weight gradient on
/// one replica; data-parallel graphs reduce it first and do not match) folds into the product, so
/// that the gradient is never written and read back:
///  - plain sgd without weight decay becomes one matmul_accumulate node that adds -lr times the
///    product into the parameter (two passes over weight-sized memory instead of four); the result
///    changes only by rounding: the GEMM's store computes p + (-1 * lr) * acc, the update
///    p - lr * g;
///  - sgd_momentum (any weight decay, Nesterov or not) becomes one matmul_sgd_momentum node that
///    computes the gradient a cache-sized block at a time and updates the parameter and velocity
///    with each block (four passes instead of seven), with the update's own loop.
/// Only updates without a clipping factor (grad_scale) fuse, and only gradients with no other
/// reader that are not graph outputs. A product marked bf16 (ir::node_precision) folds only into
/// matmul_sgd_momentum, and only where that op's bf16 kernel takes it (bf16_momentum_refusal: a
/// linear layer's weight gradient on a CPU with AVX512-BF16); the fused node is then marked bf16
/// too. Elsewhere it stays apart: its bf16 multiplications and the update's extra pass over the
/// f32 gradient cost less than the f32 fused node's. The fused node takes the update's place and
/// annotations, is named "<matmul>+sgd", and records the update in the annotation "fused"; lr
/// stays the graph's learning-rate input.
/// Why matmul_sgd_momentum's bf16 kernel cannot take a product node n (a matmul, or the fused
/// node) marked bf16, or "": n must compute a^T b with plain factors and columns in multiples of
/// 16, on a CPU with AMX-BF16 or AVX512-BF16 (native/gemm_bf16.hpp).
std::string bf16_momentum_refusal(const ir::Node& n);

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

/// In training graphs after autograd: a bias_add_bwd(dy) and the conv2d_bwd_weights(dy, x) that
/// reads the same dy become one conv2d_bwd_weights_bias(dy, x) node with two outputs, the weight
/// and the bias gradients, computed in one pass over dy (oneDNN's diff_bias of the
/// backward-weights primitive; the native kernel sums each sample's dy rows after its GEMM). The
/// fused node takes the place of the earlier of the two, the weight-gradient node's name (plus
/// "+bias") and annotations (its precision), and records the bias_add_bwd in "fused". The bias
/// gradient is summed in another order than bias_add_bwd's, so its bits may differ from an
/// unfused run; each kernel's order still depends on the shapes only, not on the threads.
class FuseBiasIntoWeightGradient final : public ir::Pass {
 public:
  explicit FuseBiasIntoWeightGradient(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-bias-into-weight-gradient"; }
  std::vector<std::string> needs() const override { return {"differentiated"}; }
  std::vector<std::string> provides() const override { return {"bias-gradient-fused"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// In training graphs, after propagate-layouts (it reads the layouts and stored types that gave): a
/// max_pool2d_bwd(dy, argmax) whose result dx only a conv2d_bwd_weights_bias(dx, x) reads (a
/// first layer: conv -> [relu] -> max pool, no data gradient) becomes one
/// conv2d_bwd_weights_bias_pooled(dy, argmax, x), which packs dx's values from dy and argmax as
/// it reads them, so dx is never written: where one of that op's kernels takes the node (bf16 on
/// AMX tiles, or f32 for few input channels; disjoint windows without padding). The AMX kernel
/// gives the same bits as the two nodes; the f32 one multiplies only the position each window's
/// argmax names, in another order. The fused node takes the weight gradient's place, name (plus
/// "+pool") and annotations, and records the pooling's backward in "fused". enabled false
/// (--no-fuse): no change.
class FusePoolBackwardIntoWeightGradient final : public ir::Pass {
 public:
  explicit FusePoolBackwardIntoWeightGradient(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-pool-backward-into-weight-gradient"; }
  std::vector<std::string> needs() const override { return {"layouts-assigned"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// In every graph, after propagate-layouts (it reads the layouts and stored types that gave): a
/// max_pool2d(y) whose input y only it reads, y a conv2d's output without activation stored as
/// bf16, becomes one conv2d_max_pool2d(x, w, bias) with the pooling's outputs, their layouts and
/// its activation, which pools each sample's convolution output while it is in cache: y is never
/// written whole. Only where that op's kernel takes the node (bf16 on AMX tiles, the input stored
/// as bf16). The bits of the AMX forward and the pooling. The fused node takes the convolution's
/// place, name (plus "+pool") and annotations, and records the pooling in "fused". enabled false
/// (--no-fuse): no change.
class FuseMaxPoolIntoConvolution final : public ir::Pass {
 public:
  explicit FuseMaxPoolIntoConvolution(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-max-pool-into-convolution"; }
  std::vector<std::string> needs() const override { return {"layouts-assigned"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// In training graphs after autograd, fusion and thread-replicas: a relu_bwd(dy, y) disappears
/// into the nodes reading its result dx, when every reader either takes the mask itself or is
/// the one gradient sum that folds into it:
///  - a reader whose op declares an "activation" attribute (none on this node) and an optional
///    last input "y" it does not have yet, and that reads dx as its input 0 only
///    (batch_norm_bwd_reduce, batch_norm_bwd_data), is rebuilt reading dy, with y as its last
///    input and activation=relu: it masks dy itself (dy_eff = y > 0 ? dy : 0);
///  - a max_pool2d_bwd reading dx as its input 0 whose argmax is that of the max_pool2d with a
///    fused relu that made y is rebuilt reading dy: that argmax is -1 wherever the relu zeroed
///    y, so the pooling's backward routes no gradient there, which is the mask;
///  - at most one add(dx, other) of equal shapes (autograd's sum at a value with two readers, a
///    residual block's input) becomes relu_bwd(dy, y, other): the mask and the sum in one pass.
/// With neither kind of reader, or any other reader, the relu_bwd stays. All the nodes involved
/// must be of one thread replica, so a sum across replicas, which thread-replicas orders as a
/// tree, never folds. The bits are those of the unfused nodes (a masked entry may be +0 where
/// oneDNN's relu_bwd gave -0). The rebuilt nodes keep their names and places and record the
/// relu_bwd (and the add) in the annotation "fused".
class FuseActivationBackward final : public ir::Pass {
 public:
  explicit FuseActivationBackward(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-activation-backward"; }
  std::vector<std::string> needs() const override {
    return {"batch-norm-backward-fused", "replicas-scheduled"};
  }
  std::vector<std::string> provides() const override { return {"activation-backward-fused"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// A residual block's sum, add(batch_norm(x, mean, var, w, b), shortcut) (either order, equal
/// shapes, no broadcasting; the add's activation, relu when FuseBiasActivation folded one in),
/// becomes one batch_norm(x, mean, var, w, b, shortcut) with the add's activation: the native
/// kernel adds the shortcut to each normalised value before the activation, so the normalised
/// tensor is never written and read back (in ResNet-20, 16 MB per block of the first stage).
/// Only a batch_norm with weight and bias, activation none, whose output the add alone reads, and
/// f32 values match; when both operands are such batch_norms (a projection shortcut), the first
/// absorbs the sum. The fused node takes the add's place, the batch_norm's annotations and the
/// name "<batch_norm>+add" (plus "+relu"), and records the add in "fused". Its bits are those of
/// the native batch_norm and add it replaces. Evaluation graphs have no batch_norm left after
/// FoldBatchNorm where a convolution precedes it.
class FuseResidualIntoBatchNorm final : public ir::Pass {
 public:
  explicit FuseResidualIntoBatchNorm(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "fuse-residual-into-batch-norm"; }
  /// The add's relu is folded into the add first, and carries over.
  std::vector<std::string> needs() const override { return {"bias-activation-fused"}; }
  std::vector<std::string> provides() const override { return {"residual-fused"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

/// In evaluation graphs: conv2d (activation none) whose only reader is a batch_norm with fixed
/// statistics (mean, var, weight and bias all bound storage: the running statistics) becomes one
/// conv2d on folded weights and bias, which a fold_batch_norm node computes from the originals
/// every run (ops/nn/fold_batch_norm.cpp). The batch_norm's activation (relu, when
/// FuseBiasActivation folded one in), or a relu that is its only reader, becomes the
/// convolution's activation. Training graphs never match: their batch_norm reads the
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
