// max_pool2d: y = the maximum of each KH x KW window of x [N,C,H,W] (floor mode, implicit -inf
// padding, PyTorch's MaxPool2d); stride defaults to the kernel. The second output `argmax`
// (i32, the shape of y) is the index of the chosen element within its input plane, ih * W + iw,
// as PyTorch's return_indices gives it; max_pool2d_bwd(dy, argmax) routes dy back through it.
// `activation` relu (folded in by ops::FuseBiasActivation) applies relu to y, and marks each
// output it clamps to 0 with argmax -1 (pool::kClamped): the backward routes no gradient there,
// which is relu's mask, so a fused node's gradient is max_pool2d_bwd alone, with no relu_bwd.
//
// The native kernels take every layout and stored type (plain, nChw16c / nChw8c, nhwc; f32 or
// bf16, compared in f32: bf16 -> f32 is exact) and are declared preferred: they run under
// --backend onednn too, in place of oneDNN's, whose workspace needs converting to our argmax and
// back every step. argmax is stored in whatever layout its value carries (the output's, by
// ops::PropagateLayouts). On a CPU with AVX-512 the kernels of max_pool2d_avx512.cpp run in place
// of the loops below (the same bits; the loops stay for every other CPU, compiled for AVX2 too,
// with the lanes of a channel block counted at compile time and no branch in the backward's lane
// loops, so that AVX2 keeps them in vectors).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "minidl/core/threading.hpp"
#include "minidl/ops/bf16_round.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/native/im2col.hpp"
#include "minidl/ops/nn/max_pool2d_lanes.hpp"
#include "minidl/ops/nn/window.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

using native::ConvGeom;
using pool::kClamped;
using std::int64_t;

void infer(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 x");
  const ConvGeom g = checked_pool_geom(c, x);
  MINIDL_CHECK_NODE(c, g.H * g.W <= std::numeric_limits<std::int32_t>::max(),
                    "planes of more than 2^31 elements do not fit i32 argmax");
  (void)activation_attr(c);
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

// All values plain f32. src [N,C,H,W] -> dst [N,C,OH,OW], argmax [N,C,OH,OW]
// Vectorised over the output row: each window tap is one strided pass over the OW outputs with a
// branch-free select, rather than a data-dependent branch per element. Columns are padded with
// -inf (rows in the padding are skipped), so no pass has edge cases and padding never wins.
// The CNNs' 2x2 windows with stride 2 and no padding, planes [p0, p1): each output row reads
// its two input rows once, both taps of a row in one pass (an interleaved pair of loads), in the
// general kernel's tap order and rule, compiled for the CPU's widest vectors.
__attribute__((target_clones("avx512f", "avx2", "default"))) void fwd_plain_2x2(
    const ConvGeom& g, const float* src, float* dst, std::int32_t* argmax, int64_t p0, int64_t p1,
    bool relu) {
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, ow_n = g.OW, w = g.W;
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const float* r0 = src + p * in_plane + 2 * oh * w;
      const float* r1 = r0 + w;
      float* y = dst + p * out_plane + oh * ow_n;
      std::int32_t* am = argmax + p * out_plane + oh * ow_n;
      const auto a0 = static_cast<std::int32_t>(2 * oh * w), a1 = static_cast<std::int32_t>(a0 + w);
#pragma omp simd
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const auto c = static_cast<std::int32_t>(2 * ow);
        float m = r0[2 * ow];
        std::int32_t i = a0 + c;
        float v = r0[2 * ow + 1];
        bool take = v > m || v != v;
        m = take ? v : m;
        i = take ? a0 + c + 1 : i;
        v = r1[2 * ow];
        take = v > m || v != v;
        m = take ? v : m;
        i = take ? a1 + c : i;
        v = r1[2 * ow + 1];
        take = v > m || v != v;
        m = take ? v : m;
        i = take ? a1 + c + 1 : i;
        const bool pass = !relu || m > 0.0f;
        y[ow] = pass ? m : 0.0f;
        am[ow] = pass ? i : kClamped;
      }
    }
  }
}

void fwd_plain(const ir::KernelArgs& k) {
  const Shape& xs = k.in[0].shape();
  const ConvGeom g = pool_geom(xs, k.attrs());
  const float* src = k.in[0].data<float>();
  float* dst = k.out[0].data<float>();
  std::int32_t* argmax = k.out[1].data<std::int32_t>();
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, wp = g.W + 2 * g.PW;
  const int64_t ow_n = g.OW, sw = g.SW;
  const bool relu = activation_of(k.attrs()) == Activation::Relu;
  if (g.KH == 2 && g.KW == 2 && g.SH == 2 && g.SW == 2 && g.PH == 0 && g.PW == 0) {
    parallel_for(xs[0] * g.C, out_plane * 4, [&](int64_t p0, int64_t p1) {
      if (pool::avx512_kernels())
        return pool::fwd_plain_2x2_avx512(g, src, dst, argmax, p0, p1, relu);
      fwd_plain_2x2(g, src, dst, argmax, p0, p1, relu);
    });
    return;
  }
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
        if (relu) {
#pragma omp simd
          for (int64_t ow = 0; ow < ow_n; ++ow) {
            const bool pass = y[ow] > 0.0f;
            y[ow] = pass ? y[ow] : 0.0f;
            am[ow] = pass ? am[ow] : kClamped;
          }
        }
      }
    }
  });
}

// All values plain f32. diff_dst [N,C,OH,OW], argmax [N,C,OH,OW] -> diff_src [N,C,H,W].
// Overlapping windows may pick the same element; one thread owns each plane and adds in output
// order, so the sums are deterministic.
void bwd_plain(const ir::KernelArgs& k) {
  const Shape& xs = k.out[0].shape();
  const int64_t in_plane = xs[2] * xs[3];
  const int64_t out_plane = k.in[0].shape()[2] * k.in[0].shape()[3];
  const float* dy = k.in[0].data<float>();
  const std::int32_t* argmax = k.in[1].data<std::int32_t>();
  float* dx = k.out[0].data<float>();
  // The CNNs' 2x2 windows with stride 2: every element of dx written once, vectorised (as the
  // layout kernels' disjoint path, it routes dy only to an argmax inside its window, which is
  // where the forward puts it).
  const ConvGeom geo = pool_geom(xs, k.attrs());
  if (pool::avx512_kernels() && geo.KH == 2 && geo.KW == 2 && geo.SH == 2 && geo.SW == 2 &&
      geo.PH == 0 && geo.PW == 0) {
    parallel_for(xs[0] * xs[1], in_plane + out_plane, [&](int64_t p0, int64_t p1) {
      pool::bwd_plain_2x2_avx512(geo, dy, argmax, dx, p0, p1);
    });
    return;
  }
  parallel_for(xs[0] * xs[1], in_plane + out_plane, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* d = dx + p * in_plane;
      const float* g = dy + p * out_plane;
      const std::int32_t* am = argmax + p * out_plane;
      std::fill_n(d, in_plane, 0.0f);
      for (int64_t o = 0; o < out_plane; ++o) {
        if (am[o] == kClamped) continue;
        MINIDL_ASSERT(am[o] >= 0 && am[o] < in_plane, "argmax ", am[o], " outside the plane");
        d[am[o]] += g[o];
      }
    }
  });
}

// ---- every layout and stored type ---------------------------------------------------------------
//
// The addressing of the four layouts and the row kernels' arguments are in max_pool2d_lanes.hpp;
// on a CPU with AVX-512 the kernels of max_pool2d_avx512.cpp run in place of the loops below.

using pool::Addr;
using pool::addr_of;
using pool::BwdArgs;
using pool::FwdArgs;
using pool::same_addr;

// f32 values and bf16 ones (the upper half of an f32, ir::Value::stored).
[[gnu::always_inline]] inline float load(float v) { return v; }
[[gnu::always_inline]] inline float load(std::uint16_t v) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}
[[gnu::always_inline]] inline void store(float* p, float v) { *p = v; }
// Exact for a maximum of bf16 values (the usual case).
[[gnu::always_inline]] inline void store(std::uint16_t* p, float v) { *p = bf16_round(v); }

// dx = 0.0f + dy in dx's stored type, as the zero-fill and add of the general path computes it
// (a -0 becomes +0). Between bf16 values that is a copy of the bits but for -0, done in integers
// so that it vectorises.
template <typename TD, typename TY>
[[gnu::always_inline]] inline TD grad_value(TY dy) {
  if constexpr (std::is_same_v<TD, float>) {
    return 0.0f + load(dy);
  } else if constexpr (std::is_same_v<TY, float>) {
    return bf16_round(0.0f + dy);
  } else {
    return dy == 0x8000u ? std::uint16_t{0} : dy;
  }
}
// v where hit, else +0, in integers: GCC vectorises the loops of the backward for AVX2 only without
// a branch or a conditional load in them.
template <typename TD>
[[gnu::always_inline]] inline TD keep_if(bool hit, TD v) {
  if constexpr (std::is_same_v<TD, float>) {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) &
                                (0u - static_cast<std::uint32_t>(hit)));
  } else {
    return static_cast<std::uint16_t>(v & (0u - static_cast<std::uint32_t>(hit)));
  }
}
template <typename TD>
[[gnu::always_inline]] inline void store_zero(TD* p) {
  *p = TD{0};
}

constexpr int64_t kLanes = 16;

// Calls f(std::integral_constant<int, NL>) with the lane count the row kernels below take for a
// group of `lanes` channels: kLanes or 8 where it divides them, else 0 (counted at run time). f is
// inlined into the caller, so its loops take the caller's target_clones ISA.
template <typename F>
[[gnu::always_inline]] inline void with_lane_count(int64_t lanes, F&& f) {
  if (lanes % kLanes == 0) {
    f(std::integral_constant<int, kLanes>{});
  } else if (lanes % 8 == 0) {
    f(std::integral_constant<int, 8>{});
  } else {
    f(std::integral_constant<int, 0>{});
  }
}

// Output row oh of channel group grp: for each window, the maximum over its taps of `lanes`
// channels at once. Taps in row-major order with a strict >: the first maximum wins ties, and a
// NaN wins over numbers (a later NaN over an earlier one), as the plain kernel and PyTorch. The
// index starts at the window's first input element, right even when every element is -inf.
// NL > 0: the group's lanes come NL at a time (NL divides them), a trip count the compiler knows,
// so that each lane loop becomes one or two vectors held in registers across the taps; NL = 0:
// up to kLanes at a time, counted at run time (any group).
template <int NL, typename TX, typename TY>
[[gnu::always_inline]] inline void fwd_row(const FwdArgs& a, const TX* src, TY* dst,
                                           std::int32_t* argmax, int64_t grp, int64_t oh) {
  const ConvGeom& g = a.g;
  const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * a.x.block;
  const int64_t lanes = a.x.block, xs = a.x.step(), ys = a.y.step(), as = a.am.step();
  const int64_t h0 = oh * g.SH - g.PH;
  const int64_t ih0 = std::max<int64_t>(h0, 0), ih1 = std::min(h0 + g.KH, g.H);
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  constexpr int64_t kStep = NL > 0 ? NL : kLanes;
  for (int64_t j0 = 0; j0 < lanes; j0 += kStep) {
    const int64_t nl = NL > 0 ? NL : std::min(kLanes, lanes - j0);
    const TX* xg = src + a.x.base(n, c0 + j0);
    int64_t yb[kLanes], ab[kLanes];
    for (int64_t j = 0; j < nl; ++j) {
      yb[j] = a.y.base(n, c0 + j0 + j);
      ab[j] = a.am.base(n, c0 + j0 + j);
    }
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const int64_t w0 = ow * g.SW - g.PW;
      const int64_t iw0 = std::max<int64_t>(w0, 0), iw1 = std::min(w0 + g.KW, g.W);
      float acc[kLanes];
      std::int32_t idx[kLanes];
      const auto first = static_cast<std::int32_t>(ih0 * g.W + iw0);
#pragma omp simd
      for (int64_t j = 0; j < nl; ++j) {
        acc[j] = kLowest;
        idx[j] = first;
      }
      for (int64_t ih = ih0; ih < ih1; ++ih) {
        for (int64_t iw = iw0; iw < iw1; ++iw) {
          const TX* p = xg + (ih * g.W + iw) * xs;
          const auto at = static_cast<std::int32_t>(ih * g.W + iw);
#pragma omp simd
          for (int64_t j = 0; j < nl; ++j) {
            const float v = load(p[j]);
            const bool take = v > acc[j] || v != v;
            acc[j] = take ? v : acc[j];
            idx[j] = take ? at : idx[j];
          }
        }
      }
      if (a.relu) {
#pragma omp simd
        for (int64_t j = 0; j < nl; ++j) {
          const bool pass = acc[j] > 0.0f;
          acc[j] = pass ? acc[j] : 0.0f;
          idx[j] = pass ? idx[j] : kClamped;
        }
      }
      const int64_t pos = oh * g.OW + ow;
      if (a.contiguous) {
        TY* y = dst + yb[0] + pos * ys;
        std::int32_t* am = argmax + ab[0] + pos * as;
#pragma omp simd
        for (int64_t j = 0; j < nl; ++j) {
          store(y + j, acc[j]);
          am[j] = idx[j];
        }
      } else {
        for (int64_t j = 0; j < nl; ++j) {
          store(dst + yb[j] + pos * ys, acc[j]);
          argmax[ab[j] + pos * as] = idx[j];
        }
      }
    }
  }
}

// The vectorised loops are compiled for the CPU's widest vectors (the build targets the baseline
// x86-64 otherwise): 16 f32 lanes are one AVX-512 register.
template <typename TX, typename TY>
__attribute__((target_clones("avx512f", "avx2", "default"))) void fwd_rows(const FwdArgs& a,
                                                                           const TX* src, TY* dst,
                                                                           std::int32_t* argmax,
                                                                           int64_t u0, int64_t u1) {
  with_lane_count(
      a.x.block, [&](auto nl) __attribute__((always_inline)) {
        for (int64_t u = u0; u < u1; ++u)
          fwd_row<nl.value>(a, src, dst, argmax, u / a.g.OH, u % a.g.OH);
      });
}

template <typename TX, typename TY>
void fwd_layouts(const ir::KernelArgs& k, const FwdArgs& a) {
  const TX* src = static_cast<const TX*>(k.in[0].raw());
  TY* dst = static_cast<TY*>(k.out[0].raw());
  std::int32_t* argmax = k.out[1].data<std::int32_t>();
  const int64_t units = k.in[0].shape()[0] * a.groups_per_n * a.g.OH;
  const auto plain = [](const Addr& v) { return v.block == 1 && !v.nhwc; };
  if (pool::avx512_kernels() && !a.contiguous && !plain(a.x) && plain(a.y) && plain(a.am)) {
    // pool2 before the flatten: the outputs of a group are made in x's order, then transposed.
    const int64_t groups = k.in[0].shape()[0] * a.groups_per_n;
    parallel_for(groups, a.g.OH * a.g.OW * a.g.KH * a.g.KW * a.x.block,
                 [&](int64_t g0, int64_t g1) {
                   pool::fwd_planes_to_plain_avx512(a, src, dst, argmax, g0, g1);
                 });
    return;
  }
  parallel_for(units, a.g.OW * a.g.KH * a.g.KW * a.x.block, [&](int64_t u0, int64_t u1) {
    if (pool::avx512_kernels()) return pool::fwd_rows_avx512(a, src, dst, argmax, u0, u1);
    fwd_rows<TX, TY>(a, src, dst, argmax, u0, u1);
  });
}

// src [N,C,H,W] -> dst [N,C,OH,OW], argmax [N,C,OH,OW], each in its own layout and stored type.
void max_pool2d_fwd(const ir::KernelArgs& k) {
  const ir::Node& n = *k.node;
  const ir::Value &x = *n.input(0), &y = *n.output(0), &am = *n.output(1);
  const bool plain = x.layout().empty() && y.layout().empty() && am.layout().empty();
  if (plain && x.stored() == DType::F32 && y.stored() == DType::F32) return fwd_plain(k);
  FwdArgs a;
  a.g = pool_geom(x.shape(), k.attrs());
  a.x = addr_of(x, a.g.H * a.g.W);
  a.y = addr_of(y, a.g.OH * a.g.OW);
  a.am = addr_of(am, a.g.OH * a.g.OW);
  a.groups_per_n = a.g.C / a.x.block;
  a.contiguous = same_addr(a.x, a.y) && same_addr(a.x, a.am);
  a.relu = activation_of(k.attrs()) == Activation::Relu;
  const bool xb = x.stored() == DType::BF16, yb = y.stored() == DType::BF16;
  if (!xb && !yb) return fwd_layouts<float, float>(k, a);
  if (xb && yb) return fwd_layouts<std::uint16_t, std::uint16_t>(k, a);
  if (xb) return fwd_layouts<std::uint16_t, float>(k, a);
  return fwd_layouts<float, std::uint16_t>(k, a);
}

// Windows that do not overlap and have no padding (stride >= kernel: the CNNs' 2x2 stride 2):
// input row ih of group grp, every element written once, dy where the argmax of its window names
// it and 0 elsewhere (also in rows and columns no window covers). 0.0f + dy, not dy: the bits of
// the zero-fill and add of the general path (a -0 gradient becomes +0).
// NL as fwd_row's.
template <int NL, typename TD, typename TY>
[[gnu::always_inline]] inline void bwd_row_disjoint(const BwdArgs& a, TD* dst, const TY* src,
                                                    const std::int32_t* argmax, int64_t grp,
                                                    int64_t ih) {
  const ConvGeom& g = a.g;
  const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * a.dx.block;
  const int64_t lanes = a.dx.block, xs = a.dx.step(), ys = a.dy.step(), as = a.am.step();
  const int64_t oh = ih / g.SH;
  const bool row = oh < g.OH && ih - oh * g.SH < g.KH;
  constexpr int64_t kStep = NL > 0 ? NL : kLanes;
  for (int64_t j0 = 0; j0 < lanes; j0 += kStep) {
    const int64_t nl = NL > 0 ? NL : std::min(kLanes, lanes - j0);
    TD* xg = dst + a.dx.base(n, c0 + j0);
    int64_t yb[kLanes], ab[kLanes];
    for (int64_t j = 0; j < nl; ++j) {
      yb[j] = a.dy.base(n, c0 + j0 + j);
      ab[j] = a.am.base(n, c0 + j0 + j);
    }
    int64_t ow = 0, s = 0;  // the window of column iw and its column within it
    for (int64_t iw = 0; iw < g.W; ++iw) {
      TD* d = xg + (ih * g.W + iw) * xs;
      const bool covered = row && ow < g.OW && s < g.KW;
      const auto at = static_cast<std::int32_t>(ih * g.W + iw);
      const int64_t pos = oh * g.OW + ow;
      if (!covered) {
#pragma omp simd
        for (int64_t j = 0; j < nl; ++j) store_zero(d + j);
      } else if (a.contiguous) {
        const TY* dy = src + yb[0] + pos * ys;
        const std::int32_t* am = argmax + ab[0] + pos * as;
#pragma omp simd
        for (int64_t j = 0; j < nl; ++j) d[j] = keep_if(am[j] == at, grad_value<TD>(dy[j]));
      } else {
        for (int64_t j = 0; j < nl; ++j)
          d[j] = keep_if(argmax[ab[j] + pos * as] == at, grad_value<TD>(src[yb[j] + pos * ys]));
      }
      if (++s == g.SW) s = 0, ++ow;
    }
  }
}

template <typename TD, typename TY>
__attribute__((target_clones("avx512f", "avx2", "default"))) void bwd_rows_disjoint(
    const BwdArgs& a, TD* dst, const TY* src, const std::int32_t* argmax, int64_t u0, int64_t u1) {
  with_lane_count(
      a.dx.block, [&](auto nl) __attribute__((always_inline)) {
        for (int64_t u = u0; u < u1; ++u)
          bwd_row_disjoint<nl.value>(a, dst, src, argmax, u / a.g.H, u % a.g.H);
      });
}

// Overlapping or padded windows, group grp: the group's planes are summed in f32 (in dx itself,
// or in scratch when dx is stored as bf16), zero-filled, then dy added at each argmax in output
// order, the plain kernel's order, so the sums have its bits.
template <typename TD, typename TY>
void bwd_group_scatter(const BwdArgs& a, TD* dst, const TY* src, const std::int32_t* argmax,
                       int64_t grp) {
  const ConvGeom& g = a.g;
  const int64_t n = grp / a.groups_per_n, c0 = grp % a.groups_per_n * a.dx.block;
  const int64_t lanes = a.dx.block, xs = a.dx.step(), ys = a.dy.step(), as = a.am.step();
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW;
  TD* xg = dst + a.dx.base(n, c0);
  // nhwc's group is a whole sample: its positions lie `xs` apart, its lanes side by side.
  float* acc = nullptr;
  if constexpr (std::is_same_v<TD, float>) {
    acc = nullptr;
  } else {
    acc = native::thread_scratch(static_cast<std::size_t>(in_plane * lanes));
  }
  auto at = [&](int64_t pos, int64_t j) -> float& {
    if constexpr (std::is_same_v<TD, float>) {
      return xg[pos * xs + j];
    } else {
      return acc[pos * lanes + j];
    }
  };
  for (int64_t p = 0; p < in_plane; ++p)
    for (int64_t j = 0; j < lanes; ++j) at(p, j) = 0.0f;
  for (int64_t j = 0; j < lanes; ++j) {
    const int64_t yb = a.dy.base(n, c0 + j), ab = a.am.base(n, c0 + j);
    for (int64_t o = 0; o < out_plane; ++o) {
      const std::int32_t i = argmax[ab + o * as];
      if (i == kClamped) continue;
      MINIDL_ASSERT(i >= 0 && i < in_plane, "argmax ", i, " outside the plane");
      at(i, j) += load(src[yb + o * ys]);
    }
  }
  if constexpr (!std::is_same_v<TD, float>) {
    for (int64_t p = 0; p < in_plane; ++p)
      for (int64_t j = 0; j < lanes; ++j) store(xg + p * xs + j, acc[p * lanes + j]);
  }
}

// Copies the N x C planes of a tensor addressed by `from` into `to`'s addressing (its layout).
template <typename T>
void repack(const T* src, const Addr& from, T* dst, const Addr& to, int64_t samples) {
  const int64_t channels = from.channels, plane = from.plane;
  parallel_for(samples * channels, plane, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const T* s = src + from.base(u / channels, u % channels);
      T* d = dst + to.base(u / channels, u % channels);
      const int64_t ss = from.step(), ds = to.step();
      for (int64_t p = 0; p < plane; ++p) d[p * ds] = s[p * ss];
    }
  });
}

template <typename TD, typename TY>
void bwd_layouts(const ir::KernelArgs& k, BwdArgs a) {
  TD* dst = static_cast<TD*>(k.out[0].raw());
  const TY* src = static_cast<const TY*>(k.in[0].raw());
  const std::int32_t* argmax = k.in[1].data<std::int32_t>();
  const ConvGeom& g = a.g;
  const int64_t groups = k.out[0].shape()[0] * a.groups_per_n;
  const bool disjoint = g.SH >= g.KH && g.SW >= g.KW && g.PH == 0 && g.PW == 0;
  const auto plain = [](const Addr& v) { return v.block == 1 && !v.nhwc; };
  if constexpr (std::is_same_v<TY, float>) {
    if (pool::avx512_kernels() && disjoint && !a.contiguous && !plain(a.dx) && plain(a.dy) &&
        plain(a.am)) {
      // The gradient after a flatten: dy and argmax transposed into dx's order group by group.
      parallel_for(groups, (g.H * g.W + g.OH * g.OW) * a.dx.block, [&](int64_t g0, int64_t g1) {
        pool::bwd_planes_from_plain_avx512(a, dst, src, argmax, g0, g1);
      });
      return;
    }
  }
  if (!a.contiguous) {
    // dy and argmax in another layout than dx (plain after a flatten, dx blocked): gathering
    // them lane by lane is slow, so they are first copied into dx's layout (a quarter of dx's
    // size for 2x2 windows), and the contiguous path runs.
    Addr to = a.dx;
    to.plane = a.dy.plane;
    const int64_t samples = k.out[0].shape()[0], numel = k.in[0].numel();
    thread_local std::vector<TY> dy_buf;
    thread_local std::vector<std::int32_t> am_buf;
    dy_buf.resize(static_cast<std::size_t>(numel));
    am_buf.resize(static_cast<std::size_t>(numel));
    repack(src, a.dy, dy_buf.data(), to, samples);
    repack(argmax, a.am, am_buf.data(), to, samples);
    src = dy_buf.data();
    argmax = am_buf.data();
    a.dy = a.am = to;
    a.contiguous = true;
  }
  if (disjoint) {
    parallel_for(groups * g.H, g.W * a.dx.block, [&](int64_t u0, int64_t u1) {
      if (pool::avx512_kernels())
        return pool::bwd_rows_disjoint_avx512(a, dst, src, argmax, u0, u1);
      bwd_rows_disjoint<TD, TY>(a, dst, src, argmax, u0, u1);
    });
    return;
  }
  parallel_for(groups, (g.H * g.W + g.OH * g.OW) * a.dx.block, [&](int64_t g0, int64_t g1) {
    for (int64_t grp = g0; grp < g1; ++grp) bwd_group_scatter(a, dst, src, argmax, grp);
  });
}

// diff_dst [N,C,OH,OW], argmax [N,C,OH,OW] -> diff_src [N,C,H,W], each in its own layout and
// stored type.
void max_pool2d_bwd(const ir::KernelArgs& k) {
  const ir::Node& n = *k.node;
  const ir::Value &dy = *n.input(0), &am = *n.input(1), &dx = *n.output(0);
  const bool plain = dx.layout().empty() && dy.layout().empty() && am.layout().empty();
  if (plain && dx.stored() == DType::F32 && dy.stored() == DType::F32) return bwd_plain(k);
  BwdArgs a;
  a.g = pool_geom(dx.shape(), k.attrs());
  a.dx = addr_of(dx, a.g.H * a.g.W);
  a.dy = addr_of(dy, a.g.OH * a.g.OW);
  a.am = addr_of(am, a.g.OH * a.g.OW);
  a.groups_per_n = a.g.C / a.dx.block;
  a.contiguous = same_addr(a.dx, a.dy) && same_addr(a.dx, a.am);
  const bool xb = dx.stored() == DType::BF16, yb = dy.stored() == DType::BF16;
  if (!xb && !yb) return bwd_layouts<float, float>(k, a);
  if (xb && yb) return bwd_layouts<std::uint16_t, std::uint16_t>(k, a);
  if (xb) return bwd_layouts<std::uint16_t, float>(k, a);
  return bwd_layouts<float, std::uint16_t>(k, a);
}

void grad(ir::GradCtx& g) {
  if (g.out_grad(0) == nullptr) return;  // only argmax is used: nothing flows back
  // A fused relu's mask is in argmax already (kClamped where it zeroed the output): dy goes
  // straight to the backward.
  ir::Value* dy = g.out_grad(0);
  const ir::Attrs& f = g.attrs();
  const ir::Attrs a{{"kernel", f.get<ir::Ints>("kernel")},
                    {"stride", f.get<ir::Ints>("stride")},
                    {"pad", f.get<ir::Ints>("pad")},
                    {"in_shape", g.input(0)->shape().dims()}};
  g.set_input_grad(0, g.op(op_max_pool2d_bwd, {dy, g.output(1)}, a));
}

}  // namespace

MINIDL_OP(max_pool2d)
    .inputs({"x"})
    .outputs({"y", "argmax"})
    .attr<ir::Ints>("kernel")
    .attr<ir::Ints>("stride", ir::Ints{})  // empty: the kernel
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    // relu applied to y (ops::FuseBiasActivation folds a following relu in): none or relu
    .attr<std::string>("activation", "none")
    .infer(infer)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::max_pool2d_kernel,
                    onednn::max_pool2d_supports)
    .layout_aware()
    .bf16_values()
#endif
    .kernel(ir::Backend::Native, max_pool2d_fwd)
    .layout_aware()
    .bf16_values()
    .preferred()
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
    .layout_aware()
    .bf16_values()
    .preferred()
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
