// The oneDNN kernels, as the op files register them (before the native kernel):
//
//   #if MINIDL_WITH_ONEDNN
//       .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::relu_kernel, eltwise_supports)
//   #endif
//
// Each *_kernel is a factory: it runs once when an executable is compiled, creates the oneDNN
// primitive for the node's shapes, and returns the per-step kernel that only binds buffers and
// executes. Each *_supports declines, with a reason, what oneDNN cannot run. This header does
// not include dnnl.hpp, so op files stay cheap to compile and build without oneDNN
// (MINIDL_WITH_ONEDNN=0, where these functions do not exist and the lines above drop out).
#pragma once

#include <string>

#include "minidl/ir/op_def.hpp"

namespace minidl::ops::onednn {

/// matmul: src a [M,K] (or [K,M] with trans_a), weights b [K,N] (or [N,K] with trans_b) -> dst
/// [M,N]; the transposes are strides of the memory descriptors.
ir::Kernel matmul_kernel(const ir::Node& n);
bool matmul_supports(const ir::Node& n, std::string* why);

/// Elementwise forward: src x -> dst y, any shape.
ir::Kernel relu_kernel(const ir::Node& n);
ir::Kernel sigmoid_kernel(const ir::Node& n);
ir::Kernel tanh_kernel(const ir::Node& n);
ir::Kernel exp_kernel(const ir::Node& n);
ir::Kernel log_kernel(const ir::Node& n);
ir::Kernel sqrt_kernel(const ir::Node& n);
ir::Kernel neg_kernel(const ir::Node& n);
ir::Kernel pow_kernel(const ir::Node& n);    // attribute exponent
ir::Kernel clamp_kernel(const ir::Node& n);  // attributes min and max (eltwise_clip)
/// Elementwise backward from the forward output: diff_dst dy, dst y -> diff_src dx.
ir::Kernel relu_bwd_kernel(const ir::Node& n);
ir::Kernel sigmoid_bwd_kernel(const ir::Node& n);
ir::Kernel tanh_bwd_kernel(const ir::Node& n);
/// The forward and backward elementwise kernels' condition: f32 and non-empty.
bool eltwise_supports(const ir::Node& n, std::string* why);

/// Binary with broadcasting: src_0 a, src_1 b -> dst y. a must have y's shape (oneDNN 2.6
/// broadcasts src_1 only); binary_supports declines the rest, which the native kernel takes.
ir::Kernel add_kernel(const ir::Node& n);
ir::Kernel sub_kernel(const ir::Node& n);
ir::Kernel mul_kernel(const ir::Node& n);
ir::Kernel div_kernel(const ir::Node& n);
ir::Kernel maximum_kernel(const ir::Node& n);
ir::Kernel minimum_kernel(const ir::Node& n);
bool binary_supports(const ir::Node& n, std::string* why);

/// max over axes: src x -> dst y (reduction_max). sum and mean have none: oneDNN's order of
/// summation may depend on the thread count, and minidl's sums must not.
ir::Kernel max_kernel(const ir::Node& n);
bool max_supports(const ir::Node& n, std::string* why);

/// softmax_cross_entropy: logits src [N,C], labels [N] -> loss [], probs dst [N,C]. probs come
/// from oneDNN's softmax; `loss` (the op's own code) computes output 0 from the logits.
ir::KernelFactory softmax_cross_entropy_kernel(ir::KernelFn loss);
bool softmax_cross_entropy_supports(const ir::Node& n, std::string* why);

/// conv2d: src x [N,C,H,W], weights w [K,C,KH,KW], optional bias [K] -> dst y [N,K,OH,OW], the
/// fused ReLU an eltwise post-op. The backward ops: diff_dst dy, weights w -> diff_src dx, and
/// diff_dst dy, src x -> diff_weights dw (and diff_bias for conv2d_bwd_weights_bias, the
/// primitive's own, computed in the same pass over dy). Each runs in oneDNN's blocked layouts,
/// reordering from and to the layouts of the node's values (plain, or blocked by
/// ops::PropagateLayouts) where they differ.
ir::Kernel conv2d_kernel(const ir::Node& n);
ir::Kernel conv2d_bwd_data_kernel(const ir::Node& n);
ir::Kernel conv2d_bwd_weights_kernel(const ir::Node& n);
bool conv2d_supports(const ir::Node& n, std::string* why);
bool conv2d_bwd_data_supports(const ir::Node& n, std::string* why);
bool conv2d_bwd_weights_supports(const ir::Node& n, std::string* why);
/// Whether the node's oneDNN primitive (any of the three ops above) runs the Winograd algorithm:
/// f32 3x3 convolutions of stride 1 between at least 32 channels, where oneDNN has the kernel
/// (AVX-512), else the direct one. MINIDL_VERBOSE=dispatch says which each node runs.
bool conv2d_winograd(const ir::Node& n);

/// max_pool2d: src x -> dst y and argmax (converted from oneDNN's workspace); max_pool2d_bwd:
/// diff_dst dy, argmax (converted back into a workspace) -> diff_src dx. avg_pool2d and
/// avg_pool2d_bwd likewise, with count_include_pad as include/exclude padding. The primitive runs
/// in the layout of the larger, input-side tensor (x, dx); the other side is reordered to it when
/// its layout differs.
ir::Kernel max_pool2d_kernel(const ir::Node& n);
ir::Kernel max_pool2d_bwd_kernel(const ir::Node& n);
ir::Kernel avg_pool2d_kernel(const ir::Node& n);
ir::Kernel avg_pool2d_bwd_kernel(const ir::Node& n);
bool max_pool2d_supports(const ir::Node& n, std::string* why);
bool max_pool2d_bwd_supports(const ir::Node& n, std::string* why);
bool avg_pool2d_supports(const ir::Node& n, std::string* why);
bool avg_pool2d_bwd_supports(const ir::Node& n, std::string* why);

/// batch_norm: src x [N,C] or [N,C,H,W], mean, variance [C], optional scale (weight) and shift
/// (bias) [C] -> dst y, oneDNN's batch normalization with global statistics.
/// batch_norm_bwd: diff_dst dy, src x, mean, variance, optional scale -> diff_src dx, diff_scale
/// dweight, diff_shift dbias; then `mean_var_grads` (the op's code) derives dmean and dvar. The
/// primitive runs in x's layout, plain or blocked; the others are reordered where they differ.
ir::Kernel batch_norm_kernel(const ir::Node& n);
ir::KernelFactory batch_norm_bwd_kernel(ir::KernelFn mean_var_grads);
bool batch_norm_supports(const ir::Node& n, std::string* why);
bool batch_norm_bwd_supports(const ir::Node& n, std::string* why);

/// The channel-blocked layout (ir::Value::layout) oneDNN picks for a convolution's output on
/// this machine: "nChw16c" or "nChw8c", or "" when it picks another one.
std::string blocked_conv_layout();
/// The layout oneDNN's bf16 convolutions pick for a bf16 result on this machine: "nhwc" (AMX),
/// "nChw16c" or "nChw8c", or "" when it has no bf16 convolution or picks another one.
std::string bf16_conv_layout();
/// Why oneDNN cannot compute in bf16 on this CPU (no AVX512-BF16 or AMX-BF16 in its effective
/// instruction set), or "" when it can.
std::string bf16_unavailable();
/// Whether oneDNN's effective instruction set has AMX's tiles (its bf16 products run on them);
/// false where it computes bf16 on AVX512-BF16 dot products or not at all.
bool bf16_on_amx();

}  // namespace minidl::ops::onednn
