// relu: y = max(x, 0); relu_bwd(dy, y, acc?) -> dx = (y > 0 ? dy : 0), plus acc when given.
// The optional addend is a gradient sum folded into the backward (ops::FuseActivationBackward:
// add(other, relu_bwd(dy, y)) at a value with two readers, such as a residual block's input):
// one pass instead of two, with the same bits as relu_bwd followed by add.
#include <bit>
#include <cstdint>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void relu_native(const ir::KernelArgs& k) {
  map_unary(k, [](float x) { return x > 0.0f ? x : 0.0f; });
}

// Mask with (y > 0), not (y >= 0): at exactly 0 we pick subgradient 0, as PyTorch does.
void relu_bwd_native(const ir::KernelArgs& k) {
  if (k.in.size() < 3) {
    map_binary(k, [](float dy, float y) { return y > 0.0f ? dy : 0.0f; });
    return;
  }
  const float* dy = k.in[0].data<float>();
  const float* y = k.in[1].data<float>();
  const float* acc = k.in[2].data<float>();
  float* dx = k.out[0].data<float>();
  elementwise(k.in[0].numel(), [&](std::int64_t lo, std::int64_t hi) {
  // dy's bits or +0, branch-free, so that the loop vectorises.
#pragma omp simd
    for (std::int64_t i = lo; i < hi; ++i) {
      const std::uint32_t keep = y[i] > 0.0f ? 0xffffffffu : 0u;
      dx[i] = acc[i] + std::bit_cast<float>(std::bit_cast<std::uint32_t>(dy[i]) & keep);
    }
  });
}

#if MINIDL_WITH_ONEDNN
// oneDNN's eltwise backward has no addend.
bool relu_bwd_onednn_supports(const ir::Node& n, std::string* why) {
  if (n.inputs().size() > 2) {
    if (why != nullptr) *why = "oneDNN's eltwise backward adds no acc";
    return false;
  }
  return onednn::eltwise_supports(n, why);
}
#endif

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.op(op_relu_bwd, {g.out_grad(0), g.output(0)})); }

}  // namespace

MINIDL_OP(relu)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::relu_kernel, onednn::eltwise_supports)
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, relu_native)
    .grad(grad);

MINIDL_OP(relu_bwd)
    .inputs({"dy", "y", "acc?"})
    .outputs({"dx"})
    .infer(infer_same_shapes)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::relu_bwd_kernel,
                    relu_bwd_onednn_supports)
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, relu_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
