// oneDNN pooling for max_pool2d, avg_pool2d and their backward ops. The primitive runs in the
// layout of the input-side tensor (x, or dx for the backward): plain NCHW, or the channel-blocked
// layout ops::PropagateLayouts gave it, for which oneDNN has its fast (JIT) pooling. The
// output-side tensor is reordered to that layout and back when its own layout differs.
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
#include <string>
#include <vector>

#include "minidl/core/threading.hpp"
#include "minidl/ops/common.hpp"
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

/// The pooling over x [N,C,H,W] into y [N,C,OH,OW] that node n describes, run in `layout`.
struct Problem {
  Shape x, y;
  ConvGeom g;
  algorithm alg;
  std::string layout;         // of both x and y inside the primitive ("" plain)
  DType stored = DType::F32;  // of both x and y inside the primitive: f32 or bf16
  std::string argmax_layout;  // max pooling: the argmax value's
};

/// The input-side value `data` (x, or dx for the backward) decides the primitive's layout and
/// element type.
Problem problem(const ir::Node& n, const Shape& x, const Shape& y, bool max,
                const ir::Value* data) {
  Problem p{x, y, pool_geom(x, n.attrs()), algorithm::pooling_max, data->layout(), data->stored()};
  if (!max) {
    p.alg = n.attrs().get<bool>("count_include_pad") ? algorithm::pooling_avg_include_padding
                                                     : algorithm::pooling_avg_exclude_padding;
  }
  return p;
}

dnnl::pooling_forward::desc forward_desc(const Problem& p, prop_kind kind) {
  const ConvGeom& g = p.g;
  return {kind,
          p.alg,
          layout_desc(p.x, p.layout, p.stored),
          layout_desc(p.y, p.layout, p.stored),
          {g.SH, g.SW},
          {g.KH, g.KW},
          {g.PH, g.PW},
          {g.PH, g.PW}};
}

// Max pooling needs the workspace, so its forward is a training one.
dnnl::pooling_forward::primitive_desc forward_pd(const Problem& p) {
  const bool max = p.alg == algorithm::pooling_max;
  return {forward_desc(p, max ? prop_kind::forward_training : prop_kind::forward_inference),
          engine()};
}

dnnl::pooling_backward::primitive_desc backward_pd(const Problem& p) {
  const ConvGeom& g = p.g;
  const dnnl::pooling_backward::desc bd(p.alg, layout_desc(p.x, p.layout, p.stored),
                                        layout_desc(p.y, p.layout, p.stored), {g.SH, g.SW},
                                        {g.KH, g.KW}, {g.PH, g.PW}, {g.PH, g.PW});
  const dnnl::pooling_forward::primitive_desc hint(forward_desc(p, prop_kind::forward_training),
                                                   engine());
  return {bd, engine(), hint};
}

/// Calls fn(o, wi, h0, w0) for every output o of the planes: wi its index in the workspace
/// (which oneDNN keeps in the primitive's layout of y), (h0, w0) its window's first tap in the
/// (unpadded) input plane, which may lie in the padding. fn returns true for a bad element;
/// returns whether any was. The walk follows the workspace's order, so that its writes or reads
/// are contiguous: plane by plane for plain, and for a blocked layout the channels of a block
/// innermost (their argmax elements, one per plane, are then read side by side).
// fn is copied into each thread and should capture by value: a workspace of bytes may alias
// anything, so after each store the compiler would reload whatever fn reaches through a
// reference or through the shared object (measured: 3x slower).
template <typename Fn>
bool for_each_output(const Problem& p, const Fn& fn_shared) {
  std::atomic<bool> any_bad{false};
  const ConvGeom& g = p.g;
  const int64_t out_plane = g.OH * g.OW, channels = p.x[1];
  // nhwc is the blocked walk with one block of all the channels.
  const int64_t block = p.layout == "nhwc" ? channels : ir::channel_block(p.layout);
  const int64_t groups = p.x[0] * channels / block;  // planes, or blocks of planes
  // The argmax in the primitive's layout too (ops::PropagateLayouts does that when both pooling
  // kernels are oneDNN's): then o is wi, and both walks are contiguous.
  const bool blocked_argmax = block > 1 && p.argmax_layout == p.layout;
  parallel_for(groups, out_plane * block, [&](int64_t g0, int64_t g1) {
    const Fn fn = fn_shared;
    bool bad = false;
    for (int64_t grp = g0; grp < g1; ++grp) {
      const int64_t first_plane = grp * block;  // n * C + cb * block: the block's first plane
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        const int64_t h0 = oh * g.SH - g.PH;
        if (block == 1) {
          const int64_t o0 = first_plane * out_plane + oh * g.OW;
#pragma omp simd reduction(| : bad)
          for (int64_t ow = 0; ow < g.OW; ++ow) bad |= fn(o0 + ow, o0 + ow, h0, ow * g.SW - g.PW);
          continue;
        }
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const int64_t pos = oh * g.OW + ow;
          const int64_t o0 = first_plane * out_plane + pos;
          const int64_t w0 = (grp * out_plane + pos) * block;
          const int64_t iw0 = ow * g.SW - g.PW;
#pragma omp simd reduction(| : bad)
          for (int64_t c = 0; c < block; ++c)
            bad |= fn(blocked_argmax ? w0 + c : o0 + c * out_plane, w0 + c, h0, iw0);
        }
      }
    }
    if (bad) any_bad.store(true, std::memory_order_relaxed);
  });
  return any_bad.load();
}

// workspace (tap r * KW + s of each window) -> argmax (ih * W + iw)
template <typename Tap>
void workspace_to_argmax(const Problem& p, const std::vector<std::int32_t>& tap_offset,
                         const Tap* ws, std::int32_t* argmax) {
  const int64_t w = p.g.W;
  const std::int32_t* offset = tap_offset.data();
  for_each_output(p, [w, offset, ws, argmax](int64_t o, int64_t wi, int64_t h0, int64_t w0) {
    argmax[o] = static_cast<std::int32_t>(h0 * w + w0) + offset[ws[wi]];
    return false;
  });
}

// argmax -> workspace, the inverse. Returns false when an argmax lies outside its window (the
// native backward would route it anyway; a workspace cannot say it).
template <typename Tap>
bool argmax_to_workspace(const Problem& p, const std::int32_t* argmax, Tap* ws) {
  const std::int32_t w = static_cast<std::int32_t>(p.g.W);
  const std::int32_t kw = static_cast<std::int32_t>(p.g.KW);
  const std::int32_t kh = static_cast<std::int32_t>(p.g.KH);
  // rel, the argmax's offset from the window's first element, is r * W + s for tap (r, s). The
  // row comes from a multiplication in double (exact for any int32 rel: it is floor((rel + 0.5)
  // / W), at least 0.5 / W away from an integer), which vectorises where an integer division
  // per element would cost more than the pooling itself.
  const double inv_w = 1.0 / static_cast<double>(w);
  return !for_each_output(
      p, [argmax, ws, w, kh, kw, inv_w](int64_t o, int64_t wi, int64_t h0, int64_t w0) {
        const std::int32_t rel = argmax[o] - static_cast<std::int32_t>(h0 * w + w0);
        const auto r = static_cast<std::int32_t>((static_cast<double>(rel) + 0.5) * inv_w);
        const std::int32_t c = rel - r * w;
        ws[wi] = static_cast<Tap>(r * kw + c);
        return rel < 0 || r >= kh || c >= kw;
      });
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
  return supported(std::move(reason), why, std::forward<Make>(make));
}

// max_pool2d, avg_pool2d: x -> y[, argmax]
Problem forward_problem(const ir::Node& n, bool max) {
  Problem p = problem(n, n.input(0)->shape(), n.output(0)->shape(), max, n.input(0));
  if (max) p.argmax_layout = n.output(1)->layout();
  return p;
}
// max_pool2d_bwd: dy, argmax -> dx; avg_pool2d_bwd: dy -> dx
Problem backward_problem(const ir::Node& n, bool max) {
  Problem p = problem(n, n.output(0)->shape(), n.input(0)->shape(), max, n.output(0));
  if (max) p.argmax_layout = n.input(1)->layout();
  return p;
}

}  // namespace

namespace {
// The workspace conversion walks argmax plain or in the primitive's layout (data's).
bool argmax_layout_ok(const ir::Value* data, const ir::Value* argmax, std::string* why) {
  if (argmax->layout().empty() || argmax->layout() == data->layout()) return true;
  if (why != nullptr) {
    *why = fmt::format("{} is in layout {}, neither plain nor the layout of {} ({})", argmax->ref(),
                       argmax->layout(), data->ref(),
                       data->layout().empty() ? "plain" : data->layout());
  }
  return false;
}
}  // namespace

bool max_pool2d_supports(const ir::Node& n, std::string* why) {
  if (activation_of(n.attrs()) != Activation::None) {
    if (why != nullptr) *why = "a fused activation: the oneDNN pooling applies none";
    return false;
  }
  if (!argmax_layout_ok(n.input(0), n.output(1), why)) return false;
  return supports(n, why, n.input(0), [&] { return forward_pd(forward_problem(n, true)); });
}
bool max_pool2d_bwd_supports(const ir::Node& n, std::string* why) {
  if (argmax_masks_relu(n.input(1))) {
    if (why != nullptr)
      *why = "argmax of a fused relu marks the zeroed outputs, which a workspace cannot";
    return false;
  }
  if (!argmax_layout_ok(n.output(0), n.input(1), why)) return false;
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
    auto s = std::make_shared<Staged>(dnnl::pooling_forward(pd), n);
    s->add(DNNL_ARG_SRC, value_desc(n.input(0)), pd.src_desc(), Args::Side::In, 0);
    s->add(DNNL_ARG_DST, value_desc(n.output(0)), pd.dst_desc(), Args::Side::Out, 0);
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
    auto s = std::make_shared<Staged>(dnnl::pooling_backward(pd), n);
    s->add(DNNL_ARG_DIFF_DST, value_desc(n.input(0)), pd.diff_dst_desc(), Args::Side::In, 0);
    s->add(DNNL_ARG_DIFF_SRC, value_desc(n.output(0)), pd.diff_src_desc(), Args::Side::Out, 0);
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
    Staged s{dnnl::pooling_forward(pd), n};
    s.add(DNNL_ARG_SRC, value_desc(n.input(0)), pd.src_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_DST, value_desc(n.output(0)), pd.dst_desc(), Args::Side::Out, 0);
    return staged_kernel(std::move(s));
  });
}

ir::Kernel avg_pool2d_bwd_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Problem p = backward_problem(n, false);
    const auto pd = backward_pd(p);
    Staged s{dnnl::pooling_backward(pd), n};
    s.add(DNNL_ARG_DIFF_DST, value_desc(n.input(0)), pd.diff_dst_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_DIFF_SRC, value_desc(n.output(0)), pd.diff_src_desc(), Args::Side::Out, 0);
    return staged_kernel(std::move(s));
  });
}

}  // namespace minidl::ops::onednn
