// sqrt: y = x^(1/2) (NaN for x < 0); dx = dy / (2 y), infinite at 0.
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void sqrt_native(const ir::KernelArgs& k) {
  map_unary(k, [](float x) { return std::sqrt(x); });
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0,
                   g.op(op_scale, {g.op(op_div, {g.out_grad(0), g.output(0)})}, {{"alpha", 0.5}}));
}

}  // namespace

MINIDL_OP(sqrt)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::sqrt_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, sqrt_native)
    .grad(grad);

}  // namespace minidl::ops
