// sum and mean over chosen axes (attribute `axes`, empty: all, giving a scalar; `keepdim`), and
// expand (broadcast to a shape, times alpha), their gradient. Each output is summed in double in
// one fixed order; a sum over every element runs over fixed chunks combined in order
// (fixed_order_sum). Either way the result is the same whatever the number of threads.
#include <algorithm>

#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/reduce/axes.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer_reduce(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  c.set_output(0, reduced_shape(c.input(0), reduced_axes(c, c.input(0)), c.attr<bool>("keepdim")));
}

// dst = scale * the sum of each output's elements of src.
void sum_into(const ir::KernelArgs& k, bool mean) {
  const Tensor& x = k.in[0];
  const float* src = x.data<float>();
  float* dst = k.out[0].data<float>();
  const ReducePlan p = reduce_plan(x.shape(), reduced_axes(k.attrs(), x.shape()));
  const double scale = mean ? 1.0 / static_cast<double>(p.count) : 1.0;
  if (p.rows * p.inner == 1) {  // every element: chunks summed in parallel, in a fixed order
    const double s = fixed_order_sum(x.numel(), [src](std::int64_t i) { return double{src[i]}; });
    *dst = static_cast<float>(mean ? s / static_cast<double>(x.numel()) : s);
    return;
  }
  reduce_each(
      p, 0.0, [src](double& acc, std::int64_t i) { acc += src[i]; },
      [dst, scale](std::int64_t o, double acc) { dst[o] = static_cast<float>(acc * scale); });
}

void sum_native(const ir::KernelArgs& k) { sum_into(k, false); }
void mean_native(const ir::KernelArgs& k) { sum_into(k, true); }

// dy, reshaped to keep the reduced dimensions as 1, expanded back to x's shape (times alpha).
void grad_reduce(ir::GradCtx& g, bool mean) {
  const Shape& x = g.input(0)->shape();
  const std::vector<bool> reduced = reduced_axes(g.attrs(), x);
  ir::Value* dy = g.out_grad(0);
  const Shape kept = reduced_shape(x, reduced, true);
  if (dy->shape().rank() != 0 && dy->shape() != kept)
    dy = g.op(op_reshape, {dy}, {{"shape", kept.dims()}});
  double alpha = 1.0;
  if (mean) alpha = static_cast<double>(kept.numel()) / static_cast<double>(x.numel());
  g.set_input_grad(0, g.op(op_expand, {dy}, {{"shape", x.dims()}, {"alpha", alpha}}));
}

void grad_sum(ir::GradCtx& g) { grad_reduce(g, false); }
void grad_mean(ir::GradCtx& g) { grad_reduce(g, true); }

void infer_expand(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  const auto dims = c.attr<ir::Ints>("shape");
  for (auto d : dims) MINIDL_CHECK_NODE(c, d > 0, "dimensions must be positive, got ", Shape(dims));
  const std::optional<Shape> y = broadcast_shapes(c.input(0), Shape(dims));
  MINIDL_CHECK_NODE(c, y.has_value() && *y == Shape(dims), "cannot expand ", c.input(0), " to ",
                    Shape(dims), " (dimensions aligned on the right must be equal or 1)");
  c.set_output(0, Shape(dims));
}

void expand_native(const ir::KernelArgs& k) {
  const float alpha = k.attrs().get<float>("alpha");
  const float* x = k.in[0].data<float>();
  float* y = k.out[0].data<float>();
  if (k.in[0].numel() == 1) {
    std::fill_n(y, k.out[0].numel(), *x * alpha);
    return;
  }
  broadcast_apply(broadcast_plan(k.in[0].shape(), k.in[0].shape(), k.out[0].shape()), x, x, y,
                  [alpha](float a, float) { return a * alpha; });
}

// Sum dy over the stretched dimensions first, so the scale runs on x's (smaller) shape.
void grad_expand(ir::GradCtx& g) {
  ir::Value* s = reduce_to(g, g.out_grad(0), g.input(0)->shape());
  const double alpha = g.attrs().get<double>("alpha");
  if (alpha != 1.0) s = g.op(op_scale, {s}, {{"alpha", alpha}});
  g.set_input_grad(0, s);
}

}  // namespace

MINIDL_OP(sum)
    .inputs({"x"})
    .attr<ir::Ints>("axes", {})
    .attr<bool>("keepdim", false)
    .infer(infer_reduce)
    .kernel(ir::Backend::Native, sum_native)
    .grad(grad_sum);

MINIDL_OP(mean)
    .inputs({"x"})
    .attr<ir::Ints>("axes", {})
    .attr<bool>("keepdim", false)
    .infer(infer_reduce)
    .kernel(ir::Backend::Native, mean_native)
    .grad(grad_mean);

MINIDL_OP(expand)
    .inputs({"x"})
    .attr<ir::Ints>("shape")
    .attr<float>("alpha", 1.0f)
    .infer(infer_expand)
    .kernel(ir::Backend::Native, expand_native)
    .grad(grad_expand);

}  // namespace minidl::ops
