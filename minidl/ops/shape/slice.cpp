// slice: x[start:end:step] along `axis`, Python's rules: negative axis, start and end count from
// the end, start and end are clamped to the dimension, step >= 1; the result must not be empty.
// slice_bwd(dy): the zero-filled x-shaped tensor (attribute `shape`) with dy scattered where the
// slice came from; its own gradient is the slice again.
#include <algorithm>
#include <cstring>
#include <limits>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

// The slice of one dimension: its first index, count and step.
struct Range {
  std::int64_t begin = 0, count = 0, step = 1;
};

// Empty when the attributes are valid for shape x, else what is wrong; r and axis are set.
std::string slice_range(const ir::Attrs& attrs, const Shape& x, int& axis, Range& r) {
  const auto a = attrs.get<std::int64_t>("axis");
  if (x.rank() == 0 || a < -x.rank() || a >= x.rank())
    return fmt::format("axis {} is out of range for rank {}", a, x.rank());
  axis = static_cast<int>(a < 0 ? a + x.rank() : a);
  const std::int64_t dim = x[axis];
  r.step = attrs.get<std::int64_t>("step");
  if (r.step < 1) return fmt::format("step must be at least 1, got {}", r.step);
  auto clamp = [dim](std::int64_t i) {
    return std::clamp(i < 0 ? i + dim : i, std::int64_t{0}, dim);
  };
  const std::int64_t start = attrs.get<std::int64_t>("start"), end = attrs.get<std::int64_t>("end");
  r.begin = clamp(start);
  const std::int64_t stop = clamp(end);
  r.count = stop > r.begin ? (stop - r.begin + r.step - 1) / r.step : 0;
  if (r.count == 0) {
    return fmt::format(
        "the slice {}:{}:{} of axis {} (size {}) is empty", start,
        end == std::numeric_limits<std::int64_t>::max() ? std::string() : std::to_string(end),
        r.step, axis, dim);
  }
  return {};
}

Shape sliced_shape(const Shape& x, int axis, const Range& r) {
  std::vector<std::int64_t> dims = x.dims();
  dims[static_cast<std::size_t>(axis)] = r.count;
  return Shape(std::move(dims));
}

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  int axis = 0;
  Range r;
  const std::string why = slice_range(c.node().attrs(), c.input(0), axis, r);
  MINIDL_CHECK_NODE(c, why.empty(), why);
  c.set_output(0, sliced_shape(c.input(0), axis, r));
}

void infer_bwd(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  const Shape x(c.attr<ir::Ints>("shape"));
  for (auto d : x.dims()) MINIDL_CHECK_NODE(c, d > 0, "dimensions must be positive, got ", x);
  int axis = 0;
  Range r;
  const std::string why = slice_range(c.node().attrs(), x, axis, r);
  MINIDL_CHECK_NODE(c, why.empty(), why);
  MINIDL_CHECK_NODE(c, sliced_shape(x, axis, r) == c.input(0), "dy has shape ", c.input(0),
                    ", expected the slice's ", sliced_shape(x, axis, r));
  c.set_output(0, x);
}

// fn(offset into the full tensor, offset into the slice, inner) for each run of inner elements.
template <typename Fn>
void for_each_run(const ir::Attrs& attrs, const Shape& full, Fn fn) {
  int axis = 0;
  Range r;
  const std::string why = slice_range(attrs, full, axis, r);
  MINIDL_CHECK(why.empty(), why);
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= full[d];
  for (int d = axis + 1; d < full.rank(); ++d) inner *= full[d];
  const std::int64_t dim = full[axis];
  parallel_for(outer * r.count, inner, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t o = t / r.count, i = t % r.count;
      fn((o * dim + r.begin + i * r.step) * inner, t * inner, inner);
    }
  });
}

void slice_native(const ir::KernelArgs& k) {
  const float* x = k.in[0].data<float>();
  float* y = k.out[0].data<float>();
  for_each_run(k.attrs(), k.in[0].shape(),
               [&](std::int64_t full, std::int64_t part, std::int64_t n) {
                 std::memcpy(y + part, x + full, static_cast<std::size_t>(n) * sizeof(float));
               });
}

void slice_bwd_native(const ir::KernelArgs& k) {
  const float* dy = k.in[0].data<float>();
  float* dx = k.out[0].data<float>();
  std::fill_n(dx, k.out[0].numel(), 0.0f);
  for_each_run(k.attrs(), k.out[0].shape(),
               [&](std::int64_t full, std::int64_t part, std::int64_t n) {
                 std::memcpy(dx + full, dy + part, static_cast<std::size_t>(n) * sizeof(float));
               });
}

ir::Attrs slice_attrs(const ir::Attrs& a) {
  return {{"axis", a.get<std::int64_t>("axis")},
          {"start", a.get<std::int64_t>("start")},
          {"end", a.get<std::int64_t>("end")},
          {"step", a.get<std::int64_t>("step")}};
}

void grad(ir::GradCtx& g) {
  ir::Attrs a = slice_attrs(g.attrs());
  a.set("shape", g.input(0)->shape().dims());
  g.set_input_grad(0, g.op(op_slice_bwd, {g.out_grad(0)}, a));
}

void grad_bwd(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_slice, {g.out_grad(0)}, slice_attrs(g.attrs())));
}

constexpr std::int64_t kToEnd = std::numeric_limits<std::int64_t>::max();

}  // namespace

MINIDL_OP(slice)
    .inputs({"x"})
    .attr<int>("axis", 0)
    .attr<std::int64_t>("start", 0)
    .attr<std::int64_t>("end", kToEnd)
    .attr<std::int64_t>("step", 1)
    .infer(infer)
    .kernel(ir::Backend::Native, slice_native)
    .grad(grad);

MINIDL_OP(slice_bwd)
    .inputs({"dy"})
    .outputs({"dx"})
    .attr<ir::Ints>("shape")
    .attr<int>("axis", 0)
    .attr<std::int64_t>("start", 0)
    .attr<std::int64_t>("end", kToEnd)
    .attr<std::int64_t>("step", 1)
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, slice_bwd_native)
    .grad(grad_bwd);

}  // namespace minidl::ops
