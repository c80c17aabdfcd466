// avg_pool2d: y = the mean of each KH x KW window of x [N,C,H,W] (floor mode, zero padding,
// PyTorch's AvgPool2d); stride defaults to the kernel. count_include_pad defaults to true, as in
// PyTorch: the padding zeros count, so every window divides by KH * KW; with false a window
// divides by the number of input elements it covers. avg_pool2d_bwd(dy) spreads dy back.
#include <algorithm>

#include "minidl/core/threading.hpp"
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
  c.set_output(0, window_out_shape(x, x[1], g));
}

// dy [N,C,OH,OW] -> dx `in_shape` [N,C,H,W]
void infer_bwd(ir::InferCtx& c) {
  const Shape& dy = c.input(0);
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 dy");
  const auto in = c.attr<ir::Ints>("in_shape");
  MINIDL_CHECK_NODE(c, in.size() == 4, "in_shape must hold [N,C,H,W], got ", ints_str(in));
  const Shape x(in);
  const ConvGeom g = checked_pool_geom(c, x);
  MINIDL_CHECK_NODE(c, dy == window_out_shape(x, x[1], g), "in_shape ", x, " pools to ",
                    window_out_shape(x, x[1], g), ", not dy's shape");
  c.set_output(0, x);
}

/// Calls fn(hb, he, wb, we, scale) for output (oh, ow): the window's input rows [hb, he) and
/// columns [wb, we), and 1 / its divisor.
template <typename Fn>
void for_each_window(const ConvGeom& g, bool count_pad, Fn&& fn) {
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const int64_t h0 = oh * g.SH - g.PH;
    const int64_t hb = std::max<int64_t>(h0, 0), he = std::min(h0 + g.KH, g.H);
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const int64_t w0 = ow * g.SW - g.PW;
      const int64_t wb = std::max<int64_t>(w0, 0), we = std::min(w0 + g.KW, g.W);
      const int64_t count = count_pad ? g.KH * g.KW : (he - hb) * (we - wb);
      fn(oh * g.OW + ow, hb, he, wb, we, 1.0f / static_cast<float>(count));
    }
  }
}

// src [N,C,H,W] -> dst [N,C,OH,OW]
void avg_pool2d_fwd(const ir::KernelArgs& k) {
  const Shape& xs = k.in[0].shape();
  const ConvGeom g = pool_geom(xs, k.attrs());
  const bool count_pad = k.attrs().get<bool>("count_include_pad");
  const float* src = k.in[0].data<float>();
  float* dst = k.out[0].data<float>();
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  parallel_for(xs[0] * g.C, out_plane * g.KH * g.KW, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const float* x = src + p * in_plane;
      float* y = dst + p * out_plane;
      for_each_window(g, count_pad,
                      [&](int64_t o, int64_t hb, int64_t he, int64_t wb, int64_t we, float scale) {
                        float s = 0.0f;
                        for (int64_t ih = hb; ih < he; ++ih) {
                          for (int64_t iw = wb; iw < we; ++iw) s += x[ih * g.W + iw];
                        }
                        y[o] = s * scale;
                      });
    }
  });
}

// diff_dst [N,C,OH,OW] -> diff_src [N,C,H,W]. One thread owns each plane and adds the windows in
// output order, so overlapping windows sum deterministically.
void avg_pool2d_bwd(const ir::KernelArgs& k) {
  const Shape& xs = k.out[0].shape();
  const ConvGeom g = pool_geom(xs, k.attrs());
  const bool count_pad = k.attrs().get<bool>("count_include_pad");
  const float* dy = k.in[0].data<float>();
  float* dx = k.out[0].data<float>();
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  parallel_for(xs[0] * g.C, in_plane + out_plane * g.KH * g.KW, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* d = dx + p * in_plane;
      const float* gy = dy + p * out_plane;
      std::fill_n(d, in_plane, 0.0f);
      for_each_window(g, count_pad,
                      [&](int64_t o, int64_t hb, int64_t he, int64_t wb, int64_t we, float scale) {
                        const float v = gy[o] * scale;
                        for (int64_t ih = hb; ih < he; ++ih) {
#pragma omp simd
                          for (int64_t iw = wb; iw < we; ++iw) d[ih * g.W + iw] += v;
                        }
                      });
    }
  });
}

void grad(ir::GradCtx& g) {
  ir::Attrs a = g.attrs();
  a.set("in_shape", g.input(0)->shape().dims());
  g.set_input_grad(0, g.op(op_avg_pool2d_bwd, {g.out_grad(0)}, a));
}

}  // namespace

MINIDL_OP(avg_pool2d)
    .inputs({"x"})
    .attr<ir::Ints>("kernel")
    .attr<ir::Ints>("stride", ir::Ints{})  // empty: the kernel
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<bool>("count_include_pad", true)
    .infer(infer)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::avg_pool2d_kernel,
                    onednn::avg_pool2d_supports)
    .layout_aware()
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, avg_pool2d_fwd)
    .grad(grad);

MINIDL_OP(avg_pool2d_bwd)
    .inputs({"dy"})
    .outputs({"dx"})
    .attr<ir::Ints>("kernel")
    .attr<ir::Ints>("stride", ir::Ints{})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<bool>("count_include_pad", true)
    .attr<ir::Ints>("in_shape")
    .infer(infer_bwd)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::avg_pool2d_bwd_kernel,
                    onednn::avg_pool2d_bwd_supports)
    .layout_aware()
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, avg_pool2d_bwd)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
