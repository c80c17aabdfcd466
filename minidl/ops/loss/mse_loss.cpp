// mse_loss: mean squared error over all elements, as torch.nn.MSELoss() (reduction 'mean').
//   x [...] f32, target [...] f32 (the same shape) -> loss []
// Summed in double over fixed chunks of rows in order, so the loss does not depend on the
// thread count. The backward is 2 (x - target) dloss / n.
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32,
                    "expected f32 input and target");
  MINIDL_CHECK_NODE(c, c.input(0) == c.input(1), "target ", c.input(1),
                    " does not have the input's shape ", c.input(0));
  c.set_output(0, Shape{});
}

void mse_loss_native(const ir::KernelArgs& k) {
  const float* x = k.in[0].data<float>();
  const float* t = k.in[1].data<float>();
  const std::int64_t n = k.in[0].numel();
  const double total = fixed_order_sum(n, [x, t](std::int64_t i) {
    const double d = static_cast<double>(x[i]) - t[i];
    return d * d;
  });
  *k.out[0].data<float>() = static_cast<float>(total / static_cast<double>(n));
}

void infer_bwd(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.input(0).numel() == 1, "expected a scalar dloss");
  MINIDL_CHECK_NODE(c, c.input(1) == c.input(2), "expected input and target of one shape");
  c.set_output(0, c.input(1));
}

// dloss [], x, target -> dx = 2 (x - target) dloss / n
void mse_loss_bwd_native(const ir::KernelArgs& k) {
  const float* x = k.in[1].data<float>();
  const float* t = k.in[2].data<float>();
  float* dx = k.out[0].data<float>();
  const std::int64_t n = k.in[1].numel();
  const float scale = 2.0f * *k.in[0].data<float>() / static_cast<float>(n);
  elementwise(n, [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) dx[i] = scale * (x[i] - t[i]);
  });
}

void grad(ir::GradCtx& g) {
  ir::Value* dx = g.op(op_mse_loss_bwd, {g.out_grad(0), g.input(0), g.input(1)});
  if (g.needs_input_grad(0)) g.set_input_grad(0, dx);
  if (g.needs_input_grad(1)) g.set_input_grad(1, g.op(op_scale, {dx}, {{"alpha", -1.0}}));
}

}  // namespace

MINIDL_OP(mse_loss)
    .inputs({"x", "target"})
    .outputs({"loss"})
    .infer(infer)
    .kernel(ir::Backend::Native, mse_loss_native)
    .grad(grad);

MINIDL_OP(mse_loss_bwd)
    .inputs({"dloss", "x", "target"})
    .outputs({"dx"})
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, mse_loss_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
