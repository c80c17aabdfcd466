// oneDNN pooling for max_pool2d, avg_pool2d and their backward ops, on plain NCHW tensors.
//
// Max pooling: our argmax (ih * W + iw within the plane, shared with the native kernels) and
// oneDNN's workspace (the tap kh * KW + kw within the window, u8 or s32 in dst's layout) say the
// same thing, so the forward converts its workspace into argmax and the backward argmax back
// into a workspace; the maximum is the first in window order on both backends (ties included).
// Where they part: a NaN wins its window natively (as in PyTorch) and is passed over by oneDNN,
// and a window of only -inf yields -inf natively, oneDNN's lowest float. Average pooling:
// count_include_pad maps to pooling_avg_include_padding, its absence to exclude_padding.
//
// Our padding is oneDNN's on both sides: with floor division its output size is ours, and every
// window lies inside [-pad, size + pad), so the divisors agree too.
#include <atomic>
#include <cstdint>
#include <vector>

#include "minidl/core/threading.hpp"
#include "minidl/ops/nn/window.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;
using native::ConvGeom;
using std::int64_t;

/// The pooling over x [N,C,H,W] into y [N,C,OH,OW] that node n describes.
struct Problem {
  Shape x, y;
  ConvGeom g;
  algorithm alg;
};

Problem problem(const ir::Node& n, const Shape& x, const Shape& y, bool max) {
  Problem p{x, y, pool_geom(x, n.attrs()), algorithm::pooling_max};
  if (!max) {
    p.alg = n.attrs().get<bool>("count_include_pad") ? algorithm::pooling_avg_include_padding
                                                     : algorithm::pooling_avg_exclude_padding;
  }
  return p;
}

dnnl::pooling_forward::desc forward_desc(const Problem& p, prop_kind kind) {
  const ConvGeom& g = p.g;
  return {kind,         p.alg,        plain_desc(p.x), plain_desc(p.y),
          {g.SH, g.SW}, {g.KH, g.KW}, {g.PH, g.PW},    {g.PH, g.PW}};
}

// Max pooling needs the workspace, so its forward is a training one.
dnnl::pooling_forward::primitive_desc forward_pd(const Problem& p) {
  const bool max = p.alg == algorithm::pooling_max;
  return {forward_desc(p, max ? prop_kind::forward_training : prop_kind::forward_inference),
          engine()};
}

dnnl::pooling_backward::primitive_desc backward_pd(const Problem& p) {
  const ConvGeom& g = p.g;
  const dnnl::pooling_backward::desc bd(p.alg, plain_desc(p.x), plain_desc(p.y), {g.SH, g.SW},
                                        {g.KH, g.KW}, {g.PH, g.PW}, {g.PH, g.PW});
  const dnnl::pooling_forward::primitive_desc hint(forward_desc(p, prop_kind::forward_training),
                                                   engine());
  return {bd, engine(), hint};
}

/// Calls fn(o, h0, w0) for every output o of the planes, (h0, w0) its window's first tap in the
/// (unpadded) input plane, which may lie in the padding.
template <typename Fn>
void for_each_output(const Problem& p, Fn&& fn) {
  const ConvGeom& g = p.g;
  const int64_t out_plane = g.OH * g.OW;
  parallel_for(p.x[0] * p.x[1], out_plane, [&](int64_t p0, int64_t p1) {
    for (int64_t plane = p0; plane < p1; ++plane) {
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const int64_t h0 = oh * g.SH - g.PH;
        const int64_t o0 = plane * out_plane + oh * g.OW;
#pragma omp simd
        for (int64_t ow = 0; ow < g.OW; ++ow) fn(o0 + ow, h0, ow * g.SW - g.PW);
      }
    }
  });
}

// workspace (tap r * KW + s of each window) -> argmax (ih * W + iw)
template <typename Tap>
void workspace_to_argmax(const Problem& p, const std::vector<std::int32_t>& tap_offset,
                         const Tap* ws, std::int32_t* argmax) {
  const int64_t w = p.g.W;
  const std::int32_t* offset = tap_offset.data();
  for_each_output(p, [&](int64_t o, int64_t h0, int64_t w0) {
    argmax[o] = static_cast<std::int32_t>(h0 * w + w0) + offset[ws[o]];
  });
}

// argmax -> workspace, the inverse. Returns false when an argmax lies outside its window (the
// native backward would route it anyway; a workspace cannot say it).
template <typename Tap>
bool argmax_to_workspace(const Problem& p, const std::int32_t* argmax, Tap* ws) {
  const ConvGeom& g = p.g;
  const int64_t out_plane = g.OH * g.OW;
  const std::int32_t w = static_cast<std::int32_t>(g.W);
  std::atomic<bool> ok{true};
  parallel_for(p.x[0] * p.x[1], out_plane, [&](int64_t p0, int64_t p1) {
    bool outside = false;
    for (int64_t plane = p0; plane < p1; ++plane) {
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const int64_t h0 = oh * g.SH - g.PH;
        const int64_t o0 = plane * out_plane + oh * g.OW;
#pragma omp simd reduction(| : outside)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const std::int32_t a = argmax[o0 + ow], ih = a / w, iw = a - ih * w;
          const int64_t r = ih - h0, s = iw - (ow * g.SW - g.PW);
          outside |= a < 0 || r < 0 || r >= g.KH || s < 0 || s >= g.KW;
          ws[o0 + ow] = static_cast<Tap>(r * g.KW + s);
        }
      }
    }
    if (outside) ok = false;
  });
  return ok;
}

/// r * W + s for tap r * KW + s of a window: the tap's input offset from the window's first.
std::vector<std::int32_t> tap_offsets(const ConvGeom& g) {
  std::vector<std::int32_t> t;
  for (int64_t r = 0; r < g.KH; ++r) {
    for (int64_t s = 0; s < g.KW; ++s) t.push_back(static_cast<std::int32_t>(r * g.W + s));
  }
  return t;
}

bool is_s32(const memory::desc& ws) { return ws.data_type() == memory::data_type::s32; }

/// Why oneDNN cannot pool: f32 x and non-empty tensors, then whatever oneDNN refuses.
template <typename Make>
bool supports(const ir::Node& n, std::string* why, const ir::Value* data, Make&& make) {
  std::string reason;
  if (data->dtype() != DType::F32) {
    reason = fmt::format("{} is {}, the oneDNN kernels take f32 only", data->ref(), data->dtype());
  }
  for (const ir::Value* v : n.inputs()) {
    if (reason.empty() && v->shape().numel() == 0) reason = fmt::format("{} is empty", v->ref());
  }
  for (const ir::Value* v : n.outputs()) {
    if (reason.empty() && v->shape().numel() == 0) reason = fmt::format("{} is empty", v->ref());
  }
  if (reason.empty()) {
    try {
      (void)make();
    } catch (const dnnl::error& e) {
      reason = describe(e);
    }
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

// max_pool2d, avg_pool2d: x -> y
Problem forward_problem(const ir::Node& n, bool max) {
  return problem(n, n.input(0)->shape(), n.output(0)->shape(), max);
}
// max_pool2d_bwd: dy, argmax -> dx; avg_pool2d_bwd: dy -> dx
Problem backward_problem(const ir::Node& n, bool max) {
  return problem(n, n.output(0)->shape(), n.input(0)->shape(), max);
}

}  // namespace

bool max_pool2d_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, n.input(0), [&] { return forward_pd(forward_problem(n, true)); });
}
bool max_pool2d_bwd_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, n.input(0), [&] { return backward_pd(backward_problem(n, true)); });
}
bool avg_pool2d_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, n.input(0), [&] { return forward_pd(forward_problem(n, false)); });
}
bool avg_pool2d_bwd_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, n.input(0), [&] { return backward_pd(backward_problem(n, false)); });
}

ir::Kernel max_pool2d_kernel(const ir::Node& n) {
  return create(n, [&]() -> ir::Kernel {
    const Problem p = forward_problem(n, true);
    const auto pd = forward_pd(p);
    auto s = std::make_shared<Staged>(dnnl::pooling_forward(pd));
    s->add(DNNL_ARG_SRC, plain_desc(p.x), pd.src_desc(), Args::Side::In, 0);
    s->add(DNNL_ARG_DST, plain_desc(p.y), pd.dst_desc(), Args::Side::Out, 0);
    const memory ws = s->buffer(DNNL_ARG_WORKSPACE, pd.workspace_desc());
    const bool s32 = is_s32(pd.workspace_desc());
    return [s, ws, s32, p, taps = tap_offsets(p.g)](const ir::KernelArgs& k) {
      s->run(k);
      std::int32_t* argmax = k.out[1].data<std::int32_t>();
      const void* w = ws.get_data_handle();
      if (s32) {
        workspace_to_argmax(p, taps, static_cast<const std::int32_t*>(w), argmax);
      } else {
        workspace_to_argmax(p, taps, static_cast<const std::uint8_t*>(w), argmax);
      }
    };
  });
}

ir::Kernel max_pool2d_bwd_kernel(const ir::Node& n) {
  return create(n, [&]() -> ir::Kernel {
    const Problem p = backward_problem(n, true);
    const auto pd = backward_pd(p);
    auto s = std::make_shared<Staged>(dnnl::pooling_backward(pd));
    s->add(DNNL_ARG_DIFF_DST, plain_desc(p.y), pd.diff_dst_desc(), Args::Side::In, 0);
    s->add(DNNL_ARG_DIFF_SRC, plain_desc(p.x), pd.diff_src_desc(), Args::Side::Out, 0);
    const memory ws = s->buffer(DNNL_ARG_WORKSPACE, pd.workspace_desc());
    const bool s32 = is_s32(pd.workspace_desc());
    return [s, ws, s32, p](const ir::KernelArgs& k) {
      const std::int32_t* argmax = k.in[1].data<std::int32_t>();
      void* w = ws.get_data_handle();
      const bool ok = s32 ? argmax_to_workspace(p, argmax, static_cast<std::int32_t*>(w))
                          : argmax_to_workspace(p, argmax, static_cast<std::uint8_t*>(w));
      MINIDL_CHECK(ok, k.node->describe(), ": an argmax lies outside its ", p.g.KH, "x", p.g.KW,
                   " window of the ", p.x, " input; the oneDNN backward routes dy within windows");
      s->run(k);
    };
  });
}

ir::Kernel avg_pool2d_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Problem p = forward_problem(n, false);
    const auto pd = forward_pd(p);
    Staged s{dnnl::pooling_forward(pd)};
    s.add(DNNL_ARG_SRC, plain_desc(p.x), pd.src_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_DST, plain_desc(p.y), pd.dst_desc(), Args::Side::Out, 0);
    return staged_kernel(std::move(s));
  });
}

ir::Kernel avg_pool2d_bwd_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Problem p = backward_problem(n, false);
    const auto pd = backward_pd(p);
    Staged s{dnnl::pooling_backward(pd)};
    s.add(DNNL_ARG_DIFF_DST, plain_desc(p.y), pd.diff_dst_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_DIFF_SRC, plain_desc(p.x), pd.diff_src_desc(), Args::Side::Out, 0);
    return staged_kernel(std::move(s));
  });
}

}  // namespace minidl::ops::onednn
