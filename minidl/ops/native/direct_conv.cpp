#include "minidl/ops/native/direct_conv.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>

#include "minidl/core/error.hpp"
#include "minidl/core/log.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/native/dot_bf16.hpp"

// The library is built for baseline x86-64; these kernels are compiled for AVX-512 and chosen at
// run time (direct_conv_supports), as the GEMM's and im2col's AVX-512 paths are.
#define MINIDL_TARGET_AVX512 __attribute__((target("avx512f")))

namespace minidl::native {
namespace {

using std::int64_t;

constexpr int kBlock = 8;  // filters per block: 8 x (1 or 2) or 8 x 3 accumulators

std::atomic<bool> g_force_off{false};

/// Lanes j of [0, 16) with lo <= base + j < hi.
std::uint16_t range_mask(int64_t base, int64_t lo, int64_t hi) {
  std::uint32_t m = 0;
  for (int64_t j = 0; j < 16; ++j) {
    if (base + j >= lo && base + j < hi) m |= 1u << j;
  }
  return static_cast<std::uint16_t>(m);
}

/// The sum of v's lanes, halving pairwise (a fixed order). Through memory: GCC 12's
/// _mm512_reduce_add_ps starts from an undefined vector and trips -Wmaybe-uninitialized.
MINIDL_TARGET_AVX512 inline float lane_sum(__m512 v) {
  alignas(64) float t[16];
  _mm512_store_ps(t, v);
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) t[j] += t[j + w];
  return t[0];
}

// ---- forward ----------------------------------------------------------------------------------

/// Output vectors [chunk, chunk + NV) of output row oh, all filters: a block of 8 filters at a
/// time holds 8 x NV accumulators, started at the bias; every tap (c, r, s) loads NV vectors of
/// input (masked: padding and the row's end read as 0) and adds them times each filter's weight.
template <int NV, int kKW>
MINIDL_TARGET_AVX512 void fwd_vectors(const DirectConv& d, const float* packed, const float* x,
                                      float* y, bool bias, bool relu, int64_t oh, int64_t chunk) {
  const ConvGeom& g = d.g;
  const int64_t taps = g.rows(), plane = g.OH * g.OW, ow0 = chunk * 16;
  // kKW > 0: the window's width known at compile time (3), so that the tap loop unrolls and its
  // masks stay in mask registers.
  const int64_t kw = kKW > 0 ? kKW : g.KW;
  const std::uint16_t* masks = d.masks.data() + chunk * kw;
  __mmask16 out[NV];
  for (int v = 0; v < NV; ++v) out[v] = d.out_masks[chunk + v];
  for (int64_t kb = 0; kb < d.blocks; ++kb) {
    const float* wk = packed + kb * taps * kBlock;
    const float* bk = packed + d.blocks * taps * kBlock + kb * kBlock;
    __m512 acc[kBlock][NV];
#pragma GCC unroll 8
    for (int k = 0; k < kBlock; ++k)
      for (int v = 0; v < NV; ++v) acc[k][v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < g.C; ++c) {
      for (int64_t r = 0; r < g.KH; ++r) {
        const int64_t ih = oh * g.SH - g.PH + r;
        if (ih < 0 || ih >= g.H) {
          wk += kw * kBlock;
          continue;
        }
        // May point before the row (padding): those lanes are masked off and never read.
        const float* row = x + (c * g.H + ih) * g.W + ow0 - g.PW;
        for (int64_t s = 0; s < kw; ++s, wk += kBlock) {
          __m512 xv[NV];
          for (int v = 0; v < NV; ++v) {
            xv[v] = _mm512_maskz_loadu_ps(masks[v * kw + s], row + s + 16 * v);
          }
#pragma GCC unroll 8
          for (int k = 0; k < kBlock; ++k) {
            const __m512 w = _mm512_set1_ps(wk[k]);
            for (int v = 0; v < NV; ++v) acc[k][v] = _mm512_fmadd_ps(w, xv[v], acc[k][v]);
          }
        }
      }
    }
    // The bias last, as a bias_add after the convolution adds it: a fused node gives the bits
    // of the unfused pair.
    if (bias) {
#pragma GCC unroll 8
      for (int k = 0; k < kBlock; ++k) {
        const __m512 b = _mm512_set1_ps(bk[k]);
        for (int v = 0; v < NV; ++v) acc[k][v] = _mm512_add_ps(acc[k][v], b);
      }
    }
    // Every index into acc a constant (k < valid tested inside), so that the accumulators stay
    // in registers: a variable index would keep the array in memory, stored every tap.
    const int64_t valid = std::min<int64_t>(kBlock, d.K - kb * kBlock);
    float* yk = y + kb * kBlock * plane + oh * g.OW + ow0;
#pragma GCC unroll 8
    for (int k = 0; k < kBlock; ++k, yk += plane) {
      if (k >= valid) break;
      for (int v = 0; v < NV; ++v) {
        // Kept where acc > 0, so NaN becomes 0, as in the GEMM's ReLU epilogue (maskz_mov, not
        // max_ps, whose GCC 12 header trips -Wmaybe-uninitialized).
        const __m512 a = acc[k][v];
        const __m512 val =
            relu ? _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ), a)
                 : a;
        _mm512_mask_storeu_ps(yk + 16 * v, out[v], val);
      }
    }
  }
}

// ---- weight gradient --------------------------------------------------------------------------

/// dw for filters [8 kb, 8 kb + 8) and taps (c, r, s0 .. s0 + SB) over n samples: 8 x SB vector
/// accumulators over every output position, reduced at the end. Filters past K read filter K-1's
/// dy (in bounds) and are not stored. The accumulators are one array per tap column, each
/// indexed by constants only: GCC keeps such arrays in registers, but not one array of 24.
template <int SB>
MINIDL_TARGET_AVX512 void bwd_weights_item(const DirectConv& d, const float* dy, const float* x,
                                           int64_t n, int64_t kb, int64_t c, int64_t r, int64_t s0,
                                           float* dw) {
  static_assert(SB >= 1 && SB <= 3);
  const ConvGeom& g = d.g;
  const int64_t plane = g.OH * g.OW, in_plane = g.H * g.W;
  int64_t dy_off[kBlock];
  for (int k = 0; k < kBlock; ++k) dy_off[k] = std::min<int64_t>(kb * kBlock + k, d.K - 1) * plane;
  __m512 a0[kBlock], a1[kBlock], a2[kBlock];
#pragma GCC unroll 8
  for (int k = 0; k < kBlock; ++k) a0[k] = a1[k] = a2[k] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + (i * g.C + c) * in_plane;
    const float* dyi = dy + i * d.K * plane;
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const int64_t ih = oh * g.SH - g.PH + r;
      if (ih < 0 || ih >= g.H) continue;
      // May point before the row (padding): those lanes are masked off and never read.
      const float* xrow = xi + ih * g.W - g.PW + s0;
      const float* drow = dyi + oh * g.OW;
      for (int64_t ch = 0; ch < d.chunks; ++ch) {
        const std::uint16_t* masks = d.masks.data() + ch * g.KW + s0;
        const float* xc = xrow + ch * 16;
        const __m512 x0 = _mm512_maskz_loadu_ps(masks[0], xc);
        const __m512 x1 = SB > 1 ? _mm512_maskz_loadu_ps(masks[SB > 1 ? 1 : 0], xc + 1) : x0;
        const __m512 x2 = SB > 2 ? _mm512_maskz_loadu_ps(masks[SB > 2 ? 2 : 0], xc + 2) : x0;
        const __mmask16 out = d.out_masks[ch];
        const float* dc = drow + ch * 16;
#pragma GCC unroll 8
        for (int k = 0; k < kBlock; ++k) {
          const __m512 dv = _mm512_maskz_loadu_ps(out, dc + dy_off[k]);
          a0[k] = _mm512_fmadd_ps(dv, x0, a0[k]);
          if constexpr (SB > 1) a1[k] = _mm512_fmadd_ps(dv, x1, a1[k]);
          if constexpr (SB > 2) a2[k] = _mm512_fmadd_ps(dv, x2, a2[k]);
        }
      }
    }
  }
  const int64_t valid = std::min<int64_t>(kBlock, d.K - kb * kBlock);
  const int64_t taps = g.rows(), t0 = (c * g.KH + r) * g.KW + s0;
#pragma GCC unroll 8
  for (int k = 0; k < kBlock; ++k) {
    if (k >= valid) break;
    float* out = dw + (kb * kBlock + k) * taps + t0;
    out[0] = lane_sum(a0[k]);
    if constexpr (SB > 1) out[1] = lane_sum(a1[k]);
    if constexpr (SB > 2) out[2] = lane_sum(a2[k]);
  }
}

/// db[k] = the sum of filter k's dy over n samples: four vector accumulators, each sample's
/// plane taken four vectors at a time, then added pairwise and reduced.
MINIDL_TARGET_AVX512 void bwd_bias_item(const DirectConv& d, const float* dy, int64_t n, int64_t k,
                                        float* db) {
  const int64_t plane = d.g.OH * d.g.OW, full = plane / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (plane % 16)) - 1);
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; ++i) {
    const float* p = dy + (i * d.K + k) * plane;
    int64_t j = 0;
    for (; j + 64 <= full; j += 64) {
      a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + j));
      a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + j + 16));
      a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + j + 32));
      a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + j + 48));
    }
    for (; j < full; j += 16) a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + j));
    if (tail != 0) a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(tail, p + full));
  }
  db[k] = lane_sum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

}  // namespace

bool direct_kernels_enabled() {
  static const bool yes = env_switch("MINIDL_DIRECT_CONV") && __builtin_cpu_supports("avx512f");
  return yes;
}

namespace {
/// Whether the direct kernels may run: the CPU and MINIDL_DIRECT_CONV allow them, and no test
/// switched them off (direct_conv_force_off).
bool direct_kernels_on() {
  return direct_kernels_enabled() && !g_force_off.load(std::memory_order_relaxed);
}
}  // namespace

bool direct_conv_supports(const ConvGeom& g, int64_t K) {
  return K > 0 && g.C >= 1 && g.C <= kDirectConvMaxChannels && g.SW == 1 &&
         g.KW <= kDirectConvMaxWindow && g.OH > 0 && g.OW > 0 && direct_kernels_on();
}

void direct_conv_force_off(bool off) { g_force_off.store(off); }

DirectConv::DirectConv(const ConvGeom& geom, int64_t filters)
    : g(geom), K(filters), blocks((filters + kBlock - 1) / kBlock), chunks((geom.OW + 15) / 16) {
  MINIDL_CHECK(g.SW == 1 && g.KW <= kDirectConvMaxWindow, "direct convolution: unsupported window");
  out_masks.resize(static_cast<std::size_t>(chunks) + 1, 0);  // one more for the pair past the end
  masks.resize(static_cast<std::size_t>((chunks + 1) * g.KW), 0);
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const std::uint16_t out = range_mask(ch * 16, 0, g.OW);
    out_masks[ch] = out;
    for (int64_t s = 0; s < g.KW; ++s) {
      // Lane j reads input column ch*16 + j - PW + s.
      masks[ch * g.KW + s] = out & range_mask(ch * 16 - g.PW + s, 0, g.W);
    }
  }
}

void direct_conv_pack(const DirectConv& d, const float* weights, const float* bias, float* packed) {
  const int64_t taps = d.g.rows();
  for (int64_t kb = 0; kb < d.blocks; ++kb) {
    for (int64_t k = 0; k < kBlock; ++k) {
      const int64_t kk = kb * kBlock + k;
      float* p = packed + kb * taps * kBlock + k;
      for (int64_t t = 0; t < taps; ++t) p[t * kBlock] = kk < d.K ? weights[kk * taps + t] : 0.0f;
      packed[d.blocks * taps * kBlock + kk] = kk < d.K && bias != nullptr ? bias[kk] : 0.0f;
    }
  }
}

void direct_conv_fwd(const DirectConv& d, const float* packed, const float* x, float* y, bool bias,
                     bool relu, int64_t oh0, int64_t oh1) {
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    int64_t ch = 0;
    if (d.g.KW == 3) {
      for (; ch + 2 <= d.chunks; ch += 2) fwd_vectors<2, 3>(d, packed, x, y, bias, relu, oh, ch);
      if (ch < d.chunks) fwd_vectors<1, 3>(d, packed, x, y, bias, relu, oh, ch);
    } else {
      for (; ch + 2 <= d.chunks; ch += 2) fwd_vectors<2, 0>(d, packed, x, y, bias, relu, oh, ch);
      if (ch < d.chunks) fwd_vectors<1, 0>(d, packed, x, y, bias, relu, oh, ch);
    }
  }
}

void direct_conv_bwd_weights(const DirectConv& d, const float* dy, const float* x, int64_t n,
                             float* dw, float* db, bool parallel) {
  const ConvGeom& g = d.g;
  // Work items: (filter block, channel, kernel row, a group of up to 3 kernel columns), then one
  // per filter for the bias. Each writes its own outputs.
  const int64_t groups = (g.KW + 2) / 3;
  const int64_t weight_items = d.blocks * g.C * g.KH * groups;
  const int64_t items = weight_items + (db != nullptr ? d.K : 0);
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      if (it >= weight_items) {
        bwd_bias_item(d, dy, n, it - weight_items, db);
        continue;
      }
      const int64_t grp = it % groups, r = it / groups % g.KH, c = it / groups / g.KH % g.C;
      const int64_t kb = it / groups / g.KH / g.C;
      const int64_t s0 = grp * 3;
      switch (std::min<int64_t>(3, g.KW - s0)) {
        case 1:
          bwd_weights_item<1>(d, dy, x, n, kb, c, r, s0, dw);
          break;
        case 2:
          bwd_weights_item<2>(d, dy, x, n, kb, c, r, s0, dw);
          break;
        default:
          bwd_weights_item<3>(d, dy, x, n, kb, c, r, s0, dw);
          break;
      }
    }
  };
  if (parallel) {
    parallel_for(items, n * g.OH * d.chunks * kBlock * 3, run);
  } else {
    run(0, items);
  }
}

// ---- the weight gradient through a max pooling ---------------------------------------------

namespace {

/// Where direct_conv_bwd_weights_pooled's scratch holds what (in floats): the padded input
/// [HP][WP][C] and 16 floats for the last window row's overreach, the accumulators [K][KH][16],
/// the offsets of the positions' windows in the padded input [OH * OW] (int32), and one sample's
/// prepared windows G and O [K * POH * POW] (f32, int32).
struct PooledPlan {
  int64_t HP = 0, WP = 0, acc_at = 0, offs_at = 0, g_at = 0, o_at = 0, end = 0;
  PooledPlan(const ConvGeom& g, int64_t K, int64_t windows)
      : HP(g.H + 2 * g.PH), WP(g.W + 2 * g.PW) {
    const auto up = [](int64_t n) { return (n + 15) / 16 * 16; };
    acc_at = up(HP * WP * g.C + 16);
    offs_at = acc_at + K * g.KH * 16;
    g_at = offs_at + up(g.OH * g.OW);
    o_at = g_at + up(K * windows);
    end = o_at + up(K * windows);
  }
};

/// The f32 value of a stored one (f32, or bf16 bits).
inline float value_of(float v) { return v; }
inline float value_of(std::uint16_t v) { return dot_bf16::widened(v); }

/// 16 values from p as f32 (f32, or bf16 bits widened).
MINIDL_TARGET_AVX512 inline __m512 load_values(const float* p) { return _mm512_loadu_ps(p); }
MINIDL_TARGET_AVX512 inline __m512 load_values(const std::uint16_t* p) {
  return dot_bf16::widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

/// n windows of one sample, in their stored order (dy's and argmax's layout): each window's
/// gradient into G, and into O the offset in the padded input of the position its argmax names
/// (offs). A window whose argmax is negative (none, or clamped by a fused ReLU) gets gradient +0
/// and offset 0. Sixteen windows a vector.
template <typename TD>
MINIDL_TARGET_AVX512 void pooled_prepare(const TD* dy, const int32_t* am, int64_t n,
                                         const int32_t* offs, float* G, int32_t* O) {
  const __m512i zero = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_loadu_si512(am + i);
    const __mmask16 on = _mm512_cmpge_epi32_mask(w, zero);
    _mm512_storeu_ps(G + i, _mm512_maskz_mov_ps(on, load_values(dy + i)));
    _mm512_storeu_si512(O + i, _mm512_mask_i32gather_epi32(zero, on, w, offs, 4));
  }
  for (; i < n; ++i) {
    const bool on = am[i] >= 0;
    G[i] = on ? value_of(dy[i]) : 0.0f;
    O[i] = on ? offs[am[i]] : 0;
  }
}

/// Filters [k0, k0 + F) over the prepared windows of one sample (pooled_prepare), filter
/// k0 + f's window q at G and O + q * qstride + f * fstride: every window's gradient times the
/// window rows of the input at its offset, into acc [K][R][16] (the vector of row r holding
/// (s, c) at lane s * C + c, lanes past KW * C unused), and the gradients' sum into bias[k].
template <int F, int R>
MINIDL_TARGET_AVX512 void pooled_filters(const float* G, const int32_t* O, int64_t qstride,
                                         int64_t fstride, int64_t P, int64_t k0, const float* xpad,
                                         int64_t row, float* acc, float* bias) {
  __m512 a[F][R];
  float b[F];
  for (int f = 0; f < F; ++f) {
    for (int r = 0; r < R; ++r) a[f][r] = _mm512_loadu_ps(acc + ((k0 + f) * R + r) * 16);
    b[f] = 0.0f;
  }
  for (int64_t q = 0; q < P; ++q) {
    const float* gq = G + q * qstride;
    const int32_t* oq = O + q * qstride;
    for (int f = 0; f < F; ++f) {
      const float* x = xpad + oq[f * fstride];
      const __m512 gb = _mm512_set1_ps(gq[f * fstride]);
      for (int r = 0; r < R; ++r)
        a[f][r] = _mm512_fmadd_ps(gb, _mm512_loadu_ps(x + r * row), a[f][r]);
      b[f] += gq[f * fstride];
    }
  }
  for (int f = 0; f < F; ++f) {
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(acc + ((k0 + f) * R + r) * 16, a[f][r]);
    if (bias != nullptr) bias[k0 + f] += b[f];
  }
}

/// Every filter over one sample's prepared windows, four at a time where four filters' windows
/// lie a fixed stride apart (plain planes, or within one channel block).
template <int R>
MINIDL_TARGET_AVX512 void pooled_sample(const PooledGrad& p, int64_t K, const float* G,
                                        const int32_t* O, const float* xpad, int64_t row,
                                        float* acc, float* bias) {
  const int64_t P = p.POH * p.POW, block = p.layout.block;
  const int64_t fstride = block == 1 ? P : 1;
  int64_t k = 0;
  if (block == 1 || block % 4 == 0) {
    for (; k + 4 <= K; k += 4) {
      const int64_t at = channel_offset(k, block, P);
      pooled_filters<4, R>(G + at, O + at, block, fstride, P, k, xpad, row, acc, bias);
    }
  }
  for (; k < K; ++k) {
    const int64_t at = channel_offset(k, block, P);
    pooled_filters<1, R>(G + at, O + at, block, fstride, P, k, xpad, row, acc, bias);
  }
}

template <typename TD, typename TX>
void bwd_weights_pooled(const ConvGeom& g, int64_t K, const PooledGrad& p, const TD* dy,
                        const TX* x, int64_t x_block, int64_t n0, int64_t n1, float* out,
                        float* bias, float* scratch) {
  const int64_t C = g.C, plane = g.H * g.W, P = p.POH * p.POW;
  const PooledPlan pl(g, K, P);
  float* xpad = scratch;
  float* acc = scratch + pl.acc_at;
  auto* offs = reinterpret_cast<int32_t*>(scratch + pl.offs_at);
  float* G = scratch + pl.g_at;
  auto* O = reinterpret_cast<int32_t*>(scratch + pl.o_at);
  const int64_t row = pl.WP * C;
  // One instance per window height (direct_conv_pooled_refusal keeps it in range).
  constexpr decltype(&pooled_sample<1>) kSamples[kPooledMaxRows] = {
      pooled_sample<1>, pooled_sample<2>, pooled_sample<3>, pooled_sample<4>, pooled_sample<5>};
  MINIDL_ASSERT(g.KH >= 1 && g.KH <= kPooledMaxRows);
  const auto sample = kSamples[g.KH - 1];
  std::fill_n(xpad, pl.acc_at, 0.0f);  // the padding stays 0; each sample fills the rest
  std::fill_n(acc, K * g.KH * 16, 0.0f);
  for (int64_t oh = 0; oh < g.OH; ++oh)
    for (int64_t ow = 0; ow < g.OW; ++ow)
      offs[oh * g.OW + ow] = static_cast<int32_t>((oh * pl.WP + ow) * C);
  for (int64_t n = n0; n < n1; ++n) {
    const TX* xn = x + n * C * plane;
    for (int64_t c = 0; c < C; ++c) {
      const TX* xc = xn + channel_offset(c, x_block, plane);
      for (int64_t h = 0; h < g.H; ++h) {
        float* dst = xpad + ((h + g.PH) * pl.WP + g.PW) * C + c;
        for (int64_t w = 0; w < g.W; ++w) dst[w * C] = value_of(xc[(h * g.W + w) * x_block]);
      }
    }
    pooled_prepare(dy + n * K * P, p.argmax + n * K * P, K * P, offs, G, O);
    sample(p, K, G, O, xpad, row, acc, bias);
  }
  // acc [K][KH][(s, c)] -> out [(c, r, s)][K]
  for (int64_t k = 0; k < K; ++k)
    for (int64_t r = 0; r < g.KH; ++r)
      for (int64_t s = 0; s < g.KW; ++s)
        for (int64_t c = 0; c < C; ++c)
          out[((c * g.KH + r) * g.KW + s) * K + k] = acc[(k * g.KH + r) * 16 + s * C + c];
}

}  // namespace

std::string direct_conv_pooled_refusal(const ConvGeom& g) {
  if (!direct_kernels_on())
    return "runs minidl's AVX-512 convolution kernels only (MINIDL_DIRECT_CONV, the CPU)";
  if (g.SH != 1 || g.SW != 1) return "takes stride 1 only";
  if (g.KW * g.C > 16)
    return fmt::format("takes window rows of at most 16 values, not {} x {}", g.KW, g.C);
  if (g.KH > kPooledMaxRows)
    return fmt::format("takes windows of at most {} rows, not {}", kPooledMaxRows, g.KH);
  return "";
}

int64_t direct_conv_pooled_scratch_floats(const ConvGeom& g, int64_t K, int64_t windows) {
  return PooledPlan(g, K, windows).end;
}

void direct_conv_bwd_weights_pooled(const ConvGeom& g, int64_t K, const PooledGrad& dy,
                                    const void* x, ActLayout x_layout, int64_t n0, int64_t n1,
                                    float* acc, float* bias_acc, float* scratch) {
  dot_bf16::with_stored(
      dy.dy, dy.layout.bf16, x, x_layout.bf16, [&](const auto* d, const auto* xs) {
        bwd_weights_pooled(g, K, dy, d, xs, x_layout.block, n0, n1, acc, bias_acc, scratch);
      });
}

}  // namespace minidl::native
