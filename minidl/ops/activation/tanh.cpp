// tanh: y = tanh(x); tanh_bwd(dy, y) -> dx.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/ops/vector_math.hpp"

namespace minidl::ops {
namespace {

void tanh_native(const ir::KernelArgs& k) { map_unary_array(k, vmath::tanh); }

// The derivative from the output, 1 - y^2.
void tanh_bwd_native(const ir::KernelArgs& k) {
  map_binary(k, [](float dy, float y) { return dy * (1.0f - y * y); });
}

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.op(op_tanh_bwd, {g.out_grad(0), g.output(0)})); }

}  // namespace

MINIDL_OP(tanh)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::tanh_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, tanh_native)
    .grad(grad);

MINIDL_OP(tanh_bwd)
    .inputs({"dy", "y"})
    .outputs({"dx"})
    .infer(infer_same_shapes)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::tanh_bwd_kernel,
                    onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, tanh_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
