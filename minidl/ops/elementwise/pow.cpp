// pow: y = x^exponent, a float attribute (std::pow: NaN for x < 0 and a non-integer exponent);
// dx = dy * exponent * x^(exponent - 1).
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void pow_native(const ir::KernelArgs& k) {
  const float p = k.attrs().get<float>("exponent");
  if (p == 2.0f) return map_unary(k, [](float x) { return x * x; });
  map_unary(k, [p](float x) { return std::pow(x, p); });
}

void grad(ir::GradCtx& g) {
  const double p = g.attrs().get<double>("exponent");
  ir::Value* dy = g.out_grad(0);
  if (p == 1.0) return g.set_input_grad(0, dy);
  // x^0 is constant; a zero scale keeps 0 * x^-1 from turning x = 0 into NaN.
  if (p == 0.0) return g.set_input_grad(0, g.op(op_scale, {dy}, {{"alpha", 0.0}}));
  ir::Value* d = p == 2.0 ? g.input(0) : g.op(op_pow, {g.input(0)}, {{"exponent", p - 1.0}});
  g.set_input_grad(0, g.op(op_mul, {dy, g.op(op_scale, {d}, {{"alpha", p}})}));
}

}  // namespace

MINIDL_OP(pow)
    .inputs({"x"})
    .attr<float>("exponent")
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::pow_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, pow_native)
    .grad(grad);

}  // namespace minidl::ops
