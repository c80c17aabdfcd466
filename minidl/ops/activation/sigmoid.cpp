// sigmoid: y = 1 / (1 + exp(-x)); sigmoid_bwd(dy, y) -> dx.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/ops/vector_math.hpp"

namespace minidl::ops {
namespace {

// glibc's vector expf (ops/vector_math.hpp), without exp overflowing for either sign.
void sigmoid_native(const ir::KernelArgs& k) { map_unary_array(k, vmath::sigmoid); }

// The derivative from the output, y (1 - y), so the backward needs no exp.
void sigmoid_bwd_native(const ir::KernelArgs& k) {
  map_binary(k, [](float dy, float y) { return dy * y * (1.0f - y); });
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_sigmoid_bwd, {g.out_grad(0), g.output(0)}));
}

}  // namespace

MINIDL_OP(sigmoid)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::sigmoid_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, sigmoid_native)
    .grad(grad);

MINIDL_OP(sigmoid_bwd)
    .inputs({"dy", "y"})
    .outputs({"dx"})
    .infer(infer_same_shapes)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::sigmoid_bwd_kernel,
                    onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, sigmoid_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
