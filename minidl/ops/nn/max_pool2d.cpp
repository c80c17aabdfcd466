// max_pool2d: y = the maximum of each KH x KW window of x [N,C,H,W] (floor mode, implicit -inf
// padding, PyTorch's MaxPool2d); stride defaults to the kernel. The second output `argmax`
// (i32, the shape of y) is the index of the chosen element within its input plane, ih * W + iw,
// as PyTorch's return_indices gives it; max_pool2d_bwd(dy, argmax) routes dy back through it.
#include <algorithm>
#include <limits>

#include "minidl/core/threading.hpp"
#include "minidl/ops/native/im2col.hpp"
#include "minidl/ops/nn/window.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

using native::ConvGeom;
using std::int64_t;

void infer(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 x");
  const ConvGeom g = checked_pool_geom(c, x);
  MINIDL_CHECK_NODE(c, g.H * g.W <= std::numeric_limits<std::int32_t>::max(),
                    "planes of more than 2^31 elements do not fit i32 argmax");
  c.set_output(0, window_out_shape(x, x[1], g));
  c.set_output(1, window_out_shape(x, x[1], g), DType::I32);
}

// dy [N,C,OH,OW], argmax [N,C,OH,OW] i32 -> dx `in_shape` [N,C,H,W]
void infer_bwd(ir::InferCtx& c) {
  const Shape& dy = c.input(0);
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::I32,
                    "expected f32 dy and i32 argmax");
  MINIDL_CHECK_NODE(c, c.input(1) == dy, "argmax must have dy's shape");
  const auto in = c.attr<ir::Ints>("in_shape");
  MINIDL_CHECK_NODE(c, in.size() == 4, "in_shape must hold [N,C,H,W], got ", ints_str(in));
  const Shape x(in);
  const ConvGeom g = checked_pool_geom(c, x);
  MINIDL_CHECK_NODE(c, dy == window_out_shape(x, x[1], g), "in_shape ", x, " pools to ",
                    window_out_shape(x, x[1], g), ", not dy's shape");
  c.set_output(0, x);
}

// src [N,C,H,W] -> dst [N,C,OH,OW], argmax [N,C,OH,OW]
// Vectorised over the output row: each window tap is one strided pass over the OW outputs with a
// branch-free select, rather than a data-dependent branch per element. Columns are padded with
// -inf (rows in the padding are skipped), so no pass has edge cases and padding never wins.
void max_pool2d_fwd(const ir::KernelArgs& k) {
  const Shape& xs = k.in[0].shape();
  const ConvGeom g = pool_geom(xs, k.attrs());
  const float* src = k.in[0].data<float>();
  float* dst = k.out[0].data<float>();
  std::int32_t* argmax = k.out[1].data<std::int32_t>();
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, wp = g.W + 2 * g.PW;
  const int64_t ow_n = g.OW, sw = g.SW;
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  parallel_for(xs[0] * g.C, out_plane * g.KH * g.KW, [&](int64_t p0, int64_t p1) {
    float* buf = g.PW > 0 ? native::thread_scratch(g.H * wp) : nullptr;
    for (int64_t p = p0; p < p1; ++p) {
      const float* x = src + p * in_plane;
      if (buf != nullptr) {
        for (int64_t h = 0; h < g.H; ++h) {
          float* row = buf + h * wp;
          for (int64_t i = 0; i < g.PW; ++i) row[i] = row[g.PW + g.W + i] = kLowest;
          std::copy_n(x + h * g.W, g.W, row + g.PW);
        }
        x = buf;
      }
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        float* y = dst + p * out_plane + oh * ow_n;
        std::int32_t* am = argmax + p * out_plane + oh * ow_n;
        const int64_t h0 = oh * g.SH - g.PH;
        // Start from the window's first input element (its value is met again below): the
        // index is right even when every element is -inf.
        const int64_t first_row = std::max<int64_t>(h0, 0) * g.W;
#pragma omp simd
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          y[ow] = kLowest;
          am[ow] = static_cast<std::int32_t>(first_row + std::max<int64_t>(ow * sw - g.PW, 0));
        }
        for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + g.KH, g.H); ++ih) {
          for (int64_t s = 0; s < g.KW; ++s) {
            const float* in = x + ih * wp + s;
            const int64_t at0 = ih * g.W + s - g.PW;  // input index of ow = 0's tap
            // Taps in row-major order with a strict >: the first maximum wins ties. A NaN
            // wins over numbers, as in PyTorch.
#pragma omp simd
            for (int64_t ow = 0; ow < ow_n; ++ow) {
              const float v = in[ow * sw];
              const bool take = v > y[ow] || v != v;
              y[ow] = take ? v : y[ow];
              am[ow] = take ? static_cast<std::int32_t>(at0 + ow * sw) : am[ow];
            }
          }
        }
      }
    }
  });
}

// diff_dst [N,C,OH,OW], argmax [N,C,OH,OW] -> diff_src [N,C,H,W]. Overlapping windows may pick the
// same element; one thread owns each plane and adds in output order, so the sums are
// deterministic.
void max_pool2d_bwd(const ir::KernelArgs& k) {
  const Shape& xs = k.out[0].shape();
  const int64_t in_plane = xs[2] * xs[3];
  const int64_t out_plane = k.in[0].shape()[2] * k.in[0].shape()[3];
  const float* dy = k.in[0].data<float>();
  const std::int32_t* argmax = k.in[1].data<std::int32_t>();
  float* dx = k.out[0].data<float>();
  parallel_for(xs[0] * xs[1], in_plane + out_plane, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* d = dx + p * in_plane;
      const float* g = dy + p * out_plane;
      const std::int32_t* am = argmax + p * out_plane;
      std::fill_n(d, in_plane, 0.0f);
      for (int64_t o = 0; o < out_plane; ++o) {
        MINIDL_ASSERT(am[o] >= 0 && am[o] < in_plane, "argmax ", am[o], " outside the plane");
        d[am[o]] += g[o];
      }
    }
  });
}

void grad(ir::GradCtx& g) {
  if (g.out_grad(0) == nullptr) return;  // only argmax is used: nothing flows back
  ir::Attrs a = g.attrs();
  a.set("in_shape", g.input(0)->shape().dims());
  g.set_input_grad(0, g.op(op_max_pool2d_bwd, {g.out_grad(0), g.output(1)}, a));
}

}  // namespace

MINIDL_OP(max_pool2d)
    .inputs({"x"})
    .outputs({"y", "argmax"})
    .attr<ir::Ints>("kernel")
    .attr<ir::Ints>("stride", ir::Ints{})  // empty: the kernel
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .infer(infer)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::max_pool2d_kernel,
                    onednn::max_pool2d_supports)
    .layout_aware()
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, max_pool2d_fwd)
    .grad(grad);

MINIDL_OP(max_pool2d_bwd)
    .inputs({"dy", "argmax"})
    .outputs({"dx"})
    .attr<ir::Ints>("kernel")
    .attr<ir::Ints>("stride", ir::Ints{})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<ir::Ints>("in_shape")
    .infer(infer_bwd)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::max_pool2d_bwd_kernel,
                    onednn::max_pool2d_bwd_supports)
    .layout_aware()
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, max_pool2d_bwd)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
