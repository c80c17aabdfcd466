// relu: y = max(x, 0); relu_bwd(dy, y) -> dx.
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
  map_binary(k, [](float dy, float y) { return y > 0.0f ? dy : 0.0f; });
}

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
    .inputs({"dy", "y"})
    .outputs({"dx"})
    .infer(infer_same_shapes)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::relu_bwd_kernel,
                    onednn::eltwise_supports)
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, relu_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
