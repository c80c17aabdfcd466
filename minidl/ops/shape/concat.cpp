// concat: y = x0, x1, ... joined along `axis` (negative counts from the end); every other
// dimension must agree. The IR has no variable input count, so concat takes 1 to
// kMaxConcatInputs inputs as optional trailing inputs; ops::concat nests nodes for more.
// The gradient of input i is the slice of dy it came from.
#include <cstring>
#include <string>
#include <vector>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

std::vector<std::string> input_names() {
  std::vector<std::string> names{"x0"};
  for (int i = 1; i < kMaxConcatInputs; ++i) names.push_back(fmt::format("x{}?", i));
  return names;
}

int axis_of(const ir::Attrs& attrs, int rank) {
  const auto a = attrs.get<std::int64_t>("axis");
  return static_cast<int>(a < 0 ? a + rank : a);
}

void infer(ir::InferCtx& c) {
  const Shape& x0 = c.input(0);
  const auto a = c.attr<std::int64_t>("axis");
  MINIDL_CHECK_NODE(c, x0.rank() > 0 && a >= -x0.rank() && a < x0.rank(), "axis ", a,
                    " is out of range for rank ", x0.rank());
  const int axis = static_cast<int>(a < 0 ? a + x0.rank() : a);
  std::vector<std::int64_t> dims = x0.dims();
  for (int i = 0; i < c.num_inputs(); ++i) {
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32, got ", c.dtype(i));
    if (i == 0) continue;
    const Shape& x = c.input(i);
    bool same = x.rank() == x0.rank();
    for (int d = 0; same && d < x.rank(); ++d) same = d == axis || x[d] == x0[d];
    MINIDL_CHECK_NODE(c, same, "input ", i, " has shape ", x, ", expected the shape of input 0, ",
                      x0, ", but along axis ", axis);
    dims[static_cast<std::size_t>(axis)] += x[axis];
  }
  c.set_output(0, Shape(std::move(dims)));
}

// Each input is outer blocks of x[axis] * inner contiguous elements; output rows interleave them.
void concat_native(const ir::KernelArgs& k) {
  const Shape& y = k.out[0].shape();
  const int axis = axis_of(k.attrs(), y.rank());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= y[d];
  for (int d = axis + 1; d < y.rank(); ++d) inner *= y[d];
  const auto n = static_cast<std::int64_t>(k.in.size());
  if (n == 0) return;  // the shape rule requires x0; this keeps the divisions below defined
  std::vector<std::int64_t> offset(static_cast<std::size_t>(n) + 1, 0);
  for (std::int64_t i = 0; i < n; ++i) offset[i + 1] = offset[i] + k.in[i].shape()[axis] * inner;
  float* dst = k.out[0].data<float>();
  parallel_for(outer * n, offset[n] / n + 1, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t o = t / n, i = t % n, len = offset[i + 1] - offset[i];
      std::memcpy(dst + o * offset[n] + offset[i], k.in[i].data<float>() + o * len,
                  static_cast<std::size_t>(len) * sizeof(float));
    }
  });
}

void grad(ir::GradCtx& g) {
  const int axis = axis_of(g.attrs(), g.output(0)->shape().rank());
  std::int64_t start = 0;
  for (int i = 0; i < g.num_inputs(); ++i) {
    const std::int64_t len = g.input(i)->shape()[axis];
    if (g.needs_input_grad(i)) {
      g.set_input_grad(
          i, g.op(op_slice, {g.out_grad(0)},
                  {{"axis", std::int64_t{axis}}, {"start", start}, {"end", start + len}}));
    }
    start += len;
  }
}

}  // namespace

MINIDL_OP(concat)
    .inputs(input_names())
    .attr<int>("axis", 0)
    .infer(infer)
    .kernel(ir::Backend::Native, concat_native)
    .grad(grad);

}  // namespace minidl::ops
