// sum_squares: the sum of x's squared elements -> [] (a gradient's squared L2 norm, for
// global-norm clipping). Fixed chunks summed in double and combined in order, as `sum` does, so
// the result does not depend on the thread count.
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  c.set_output(0, Shape{});
}

void sum_squares_native(const ir::KernelArgs& k) {
  const float* x = k.in[0].data<float>();
  const double total = fixed_order_sum(
      k.in[0].numel(), [x](std::int64_t i) { return static_cast<double>(x[i]) * x[i]; });
  *k.out[0].data<float>() = static_cast<float>(total);
}

// d/dx sum(x^2) = 2 x dy
void grad(ir::GradCtx& g) {
  ir::Value* dy =
      g.op(op_expand, {g.out_grad(0)}, {{"shape", g.input(0)->shape().dims()}, {"alpha", 2.0}});
  g.set_input_grad(0, g.op(op_mul, {dy, g.input(0)}));
}

}  // namespace

MINIDL_OP(sum_squares)
    .inputs({"x"})
    .infer(infer)
    .kernel(ir::Backend::Native, sum_squares_native)
    .grad(grad);

}  // namespace minidl::ops
