// log: y = ln x (NaN for x < 0, -inf at 0); dx = dy / x.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/ops/vector_math.hpp"

namespace minidl::ops {
namespace {

void log_native(const ir::KernelArgs& k) { map_unary_array(k, vmath::log); }

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.op(op_div, {g.out_grad(0), g.input(0)})); }

}  // namespace

MINIDL_OP(log)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::log_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, log_native)
    .grad(grad);

}  // namespace minidl::ops
