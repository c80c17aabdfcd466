// max over chosen axes (`axes`, empty: all; `keepdim`), and max_bwd(dy, x): dy routed to the
// first maximal element of each output's elements (in row-major order), the others 0. A NaN
// propagates: the first NaN is picked, as the maximum and for the gradient.
#include <cmath>
#include <limits>

#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/reduce/axes.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

struct Best {
  float value;
  std::int64_t at;
};
constexpr Best kNone{-std::numeric_limits<float>::infinity(), -1};

// For every output o, the offset of its first maximal element: pick(o, offset).
template <typename Pick>
void argmax_each(const Tensor& x, const ir::Attrs& attrs, Pick pick) {
  const float* src = x.data<float>();
  const ReducePlan p = reduce_plan(x.shape(), reduced_axes(attrs, x.shape()));
  reduce_each(
      p, kNone,
      [src](Best& b, std::int64_t i) {
        // Strictly greater keeps the first maximum; at < 0 takes the first element even when
        // every element is -inf; a NaN is kept once taken.
        const float v = src[i];
        if (b.at < 0 || v > b.value || (std::isnan(v) && !std::isnan(b.value))) b = {v, i};
      },
      pick);
}

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  c.set_output(0, reduced_shape(c.input(0), reduced_axes(c, c.input(0)), c.attr<bool>("keepdim")));
}

void infer_bwd(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32, "expected f32 inputs");
  const Shape y = reduced_shape(c.input(1), reduced_axes(c, c.input(1)), c.attr<bool>("keepdim"));
  MINIDL_CHECK_NODE(c, c.input(0) == y, "dy has shape ", c.input(0), ", expected the max's ", y);
  c.set_output(0, c.input(1));
}

void max_native(const ir::KernelArgs& k) {
  float* dst = k.out[0].data<float>();
  const float* src = k.in[0].data<float>();
  argmax_each(k.in[0], k.attrs(),
              [dst, src](std::int64_t o, const Best& b) { dst[o] = src[b.at]; });
}

void max_bwd_native(const ir::KernelArgs& k) {
  const float* dy = k.in[0].data<float>();
  float* dx = k.out[0].data<float>();
  std::fill_n(dx, k.out[0].numel(), 0.0f);
  argmax_each(k.in[1], k.attrs(), [dx, dy](std::int64_t o, const Best& b) { dx[b.at] = dy[o]; });
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_max_bwd, {g.out_grad(0), g.input(0)}, g.attrs()));
}

}  // namespace

MINIDL_OP(max)
    .inputs({"x"})
    .attr<ir::Ints>("axes", {})
    .attr<bool>("keepdim", false)
    .infer(infer)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::max_kernel, onednn::max_supports)
#endif
    .kernel(ir::Backend::Native, max_native)
    .grad(grad);

MINIDL_OP(max_bwd)
    .inputs({"dy", "x"})
    .outputs({"dx"})
    .attr<ir::Ints>("axes", {})
    .attr<bool>("keepdim", false)
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, max_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
