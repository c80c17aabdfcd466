// exp: y = e^x; dx = dy * y.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/ops/vector_math.hpp"

namespace minidl::ops {
namespace {

void exp_native(const ir::KernelArgs& k) { map_unary_array(k, vmath::exp); }

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.op(op_mul, {g.out_grad(0), g.output(0)})); }

}  // namespace

MINIDL_OP(exp)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::exp_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, exp_native)
    .grad(grad);

}  // namespace minidl::ops
