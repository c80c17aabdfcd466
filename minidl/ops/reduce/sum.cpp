// sum and mean over all elements (-> scalar), and expand (scalar -> shape), their gradient.
// Sums run over fixed chunks in double and combine the chunks in order, so the result is the
// same whatever the number of threads.
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

double deterministic_sum(const float* x, std::int64_t n) {
  return fixed_order_sum(n, [x](std::int64_t i) { return static_cast<double>(x[i]); });
}

void infer_reduce(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  c.set_output(0, Shape{});
}

void sum_native(const ir::KernelArgs& k) {
  *k.out[0].data<float>() =
      static_cast<float>(deterministic_sum(k.in[0].data<float>(), k.in[0].numel()));
}

void mean_native(const ir::KernelArgs& k) {
  const std::int64_t n = k.in[0].numel();
  *k.out[0].data<float>() =
      static_cast<float>(deterministic_sum(k.in[0].data<float>(), n) / static_cast<double>(n));
}

void grad_sum(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_expand, {g.out_grad(0)}, {{"shape", g.input(0)->shape().dims()}}));
}

void grad_mean(ir::GradCtx& g) {
  const Shape& s = g.input(0)->shape();
  g.set_input_grad(0, g.op(op_expand, {g.out_grad(0)},
                           {{"shape", s.dims()}, {"alpha", 1.0 / static_cast<double>(s.numel())}}));
}

void infer_expand(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.input(0).numel() == 1, "expected a single-element input");
  const auto dims = c.attr<ir::Ints>("shape");
  for (auto d : dims) MINIDL_CHECK_NODE(c, d > 0, "dimensions must be positive, got ", Shape(dims));
  c.set_output(0, Shape(dims));
}

void expand_native(const ir::KernelArgs& k) {
  const float v = *k.in[0].data<float>() * k.attrs().get<float>("alpha");
  std::fill_n(k.out[0].data<float>(), k.out[0].numel(), v);
}

void grad_expand(ir::GradCtx& g) {
  ir::Value* s = g.op(op_sum, {g.out_grad(0)});
  const double alpha = g.attrs().get<double>("alpha");
  if (alpha != 1.0) s = g.op(op_scale, {s}, {{"alpha", alpha}});
  if (g.input(0)->shape() != s->shape())
    s = g.op(op_reshape, {s}, {{"shape", g.input(0)->shape().dims()}});
  g.set_input_grad(0, s);
}

}  // namespace

MINIDL_OP(sum)
    .inputs({"x"})
    .infer(infer_reduce)
    .kernel(ir::Backend::Native, sum_native)
    .grad(grad_sum);

MINIDL_OP(mean)
    .inputs({"x"})
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
