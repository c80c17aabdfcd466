#include "minidl/ops/native/conv_amx.hpp"

#include <algorithm>
#include <cstring>

#include "minidl/ops/bf16_round.hpp"
#include "minidl/ops/native/amx_bf16.hpp"
#include "minidl/ops/native/dot_bf16.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace minidl::native {

using std::int64_t;
using std::uint16_t;
using std::uint32_t;

namespace {

constexpr int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/// One sample's packs (see conv_amx.hpp).
struct Plan {
  int64_t WP = 0;           // padded width: positions per output row
  int64_t T = 0;            // positions, OH * WP
  int64_t Tpad = 0;         // positions rounded up to whole tiles (zero in B)
  int64_t L = 0;            // halves per plane: every run [r WP + s, r WP + s + Tpad) fits
  int64_t M = 0, Mpad = 0;  // rows of the product, and rounded up to whole tiles
  bool planes = false;      // A read from the planes in place (C % 16 == 0), else from rows
  // The positions are taken in segments of `seg` runs of 32, whose packs (dy's pairs, A's rows)
  // stay in the first-level cache: written whole per sample (70 KiB for the CIFAR CNN's first
  // layer) they went out to the second level, and their stores took 40% of the kernel's time.
  int64_t seg = 0;
  // Scratch, in floats from its start (each section a multiple of 16 floats further on).
  int64_t dy_at = 0, pos_at = 0, pooled_at = 0, planes_at = 0, rows_at = 0, end = 0;

  Plan(const ConvGeom& g, int64_t K) {
    WP = g.W + 2 * g.PW;
    T = g.OH * WP;
    Tpad = round_up(T, amx::kDepth);
    // The data of a plane ends at (H + 2 PH) WP = T + (KH - 1) WP (stride 1).
    L = round_up(Tpad + (g.KH - 1) * WP + g.KW - 1, amx::kDepth);
    M = g.rows();
    Mpad = round_up(M, amx::kRows);
    planes = g.C % amx::kRows == 0;
    constexpr int64_t kSegmentBytes = 24 * 1024;
    const int64_t steps = Tpad / amx::kDepth,
                  step_bytes = amx::kDepth * 2 * K + (planes ? 0 : Mpad * amx::kDepth * 2),
                  segments = (steps * step_bytes + kSegmentBytes - 1) / kSegmentBytes;
    seg = (steps + segments - 1) / segments;
    const int64_t seg_t = seg * amx::kDepth;
    const auto section = [&](int64_t floats) {
      const int64_t at = end;
      end += round_up(floats, 16);
      return at;
    };
    section(Mpad * K);               // the sums, [Mpad][K]
    dy_at = section(seg_t / 2 * K);  // a segment of dy in pairs of positions, [seg_t / 2][K] words
    pos_at = section(Tpad);          // each position's index in dy, or -1 (int32)
    planes_at = section(g.C * L / 2);                  // the padded planes, [C][L] halves
    rows_at = section(planes ? 0 : Mpad * seg_t / 2);  // a segment of A's rows, [Mpad][seg_t]
    pooled_at = section(Tpad);  // with a pooled dy, each position's window, or -1 (int32)
  }
};

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

using dot_bf16::interleave;
using dot_bf16::kLanes;
using dot_bf16::load16;
using dot_bf16::pair;
using dot_bf16::to_bf16;
using dot_bf16::widened;

/// x's channels into their zero-padded planes, value (c, h, w) at c L + (h + PH) WP + w + PW.
template <typename T>
void pack_planes_portable(const ConvGeom& g, const Plan& pl, const T* x, int64_t block,
                          uint16_t* xp) {
  const int64_t P = g.H * g.W;
  std::fill_n(xp, g.C * pl.L, uint16_t{0});
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t h = 0; h < g.H; ++h) {
      uint16_t* dst = xp + c * pl.L + (h + g.PH) * pl.WP + g.PW;
      const T* src = x + channel_offset(c, block, P) + h * g.W * block;
      if (block == 1) {
        dot_bf16::to_bf16_row(src, g.W, dst);
        continue;
      }
      for (int64_t w = 0; w < g.W; ++w) dst[w] = to_bf16(src[w * block]);
    }
}

/// The same from bf16 values with at most 4 channels side by side (the image's nhwc copy): 16
/// positions' values are at most 64 halves, two vectors, from which one permutation picks each
/// channel's run.
void pack_planes_narrow(const ConvGeom& g, const Plan& pl, const uint16_t* x, int64_t block,
                        uint16_t* xp) {
  const int64_t P = g.H * g.W;
  std::fill_n(xp, g.C * pl.L, uint16_t{0});
  alignas(64) uint16_t idx[4][32] = {};
  for (int64_t j = 0; j < block; ++j)
    for (int64_t i = 0; i < kLanes; ++i) idx[j][i] = static_cast<uint16_t>(i * block + j);
  for (int64_t c0 = 0; c0 < g.C; c0 += block) {
    const uint16_t* base = x + c0 * P;
    const int64_t nc = std::min(block, g.C - c0);
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t w0 = 0; w0 < g.W; w0 += kLanes) {
        const int64_t n = std::min(kLanes, g.W - w0), halves = n * block;
        const uint16_t* at = base + (h * g.W + w0) * block;
        const auto lo_mask = static_cast<__mmask32>(halves >= 32 ? ~0u : (1u << halves) - 1);
        const auto hi_mask = static_cast<__mmask32>(halves <= 32   ? 0u
                                                    : halves >= 64 ? ~0u
                                                                   : (1u << (halves - 32)) - 1);
        const __m512i lo = _mm512_maskz_loadu_epi16(lo_mask, at);
        const __m512i hi = _mm512_maskz_loadu_epi16(hi_mask, at + 32);
        uint16_t* dst = xp + c0 * pl.L + (h + g.PH) * pl.WP + g.PW + w0;
        const auto mask = static_cast<__mmask32>((1u << n) - 1);
        for (int64_t j = 0; j < nc; ++j) {
          const __m512i run =
              _mm512_maskz_permutex2var_epi16(~__mmask32{0}, lo, _mm512_load_si512(idx[j]), hi);
          _mm512_mask_storeu_epi16(dst + j * pl.L, mask, run);
        }
      }
  }
}

/// The same from bf16 values with 16 channels side by side (nhwc, nChw16c): a gather reads the
/// words (channel j, channel j + 1) of 16 positions, one permutation splits them into the two
/// channels' runs.
void pack_planes_blocked(const ConvGeom& g, const Plan& pl, const uint16_t* x, int64_t block,
                         uint16_t* xp) {
  const int64_t P = g.H * g.W;
  std::fill_n(xp, g.C * pl.L, uint16_t{0});
  const __m512i lanes = _mm512_maskz_mullo_epi32(
      0xffff, _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(static_cast<int>(block)));
  const __m512i split = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                                         30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  for (int64_t c0 = 0; c0 < g.C; c0 += kLanes) {
    const uint16_t* base = x + (c0 - c0 % block) * P + c0 % block;
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t w0 = 0; w0 < g.W; w0 += kLanes) {
        const int64_t n = std::min(kLanes, g.W - w0);
        const auto mask = static_cast<__mmask16>((1u << n) - 1);
        const uint16_t* at = base + (h * g.W + w0) * block;
        uint16_t* dst = xp + c0 * pl.L + (h + g.PH) * pl.WP + g.PW + w0;
        for (int64_t j = 0; j < kLanes; j += 2) {
          const __m512i words =
              _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, lanes, at + j, 2);
          const __m512i runs = _mm512_maskz_permutexvar_epi16(~__mmask32{0}, split, words);
          _mm512_mask_storeu_epi16(dst + j * pl.L, __mmask32{mask}, runs);
          // The upper 16 halves, to 16 halves before channel j + 1's run from their lane 16.
          _mm512_mask_storeu_epi16(dst + (j + 1) * pl.L - kLanes, __mmask32{mask} << 16, runs);
        }
      }
  }
}

/// Where pack_dy reads dy's values: in place, or (kPooled) made from a pooling's output gradient
/// and argmax (conv_amx.hpp's PooledGrad), the pooling's backward never written.
template <typename TD, bool kPooled>
struct DySource {
  const TD* dy = nullptr;  // dy, or the pooling's output gradient
  int64_t block = 1;       // of dy (and of argmax)
  int64_t plane = 0;       // positions in one of dy's channel planes (the pooling's output's)
  const int32_t* argmax = nullptr;  // kPooled only
  const int32_t* pooled = nullptr;  // kPooled only: position t's window, or -1

  /// dy and argmax where channel c's position 0 lies (argmax null unless kPooled).
  const TD* dy_at(int64_t c) const { return dy + channel_offset(c, block, plane); }
  const int32_t* argmax_at(int64_t c) const {
    return kPooled ? argmax + channel_offset(c, block, plane) : nullptr;
  }
  /// Position t (plane index p, or -1) of the 16 channels from d and am (dy_at, argmax_at), as
  /// bf16 bits.
  [[gnu::always_inline]] __m256i load(const TD* d, const int32_t* am, int64_t t, int32_t p) const {
    if constexpr (!kPooled) {
      (void)am, (void)t;
      return p >= 0 ? load16(d + p * block) : _mm256_setzero_si256();
    } else {
      const int32_t w = pooled[t];
      if (w < 0) return _mm256_setzero_si256();
      const int64_t i = w * block;
      const __mmask16 chosen =
          _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(am + i), _mm512_set1_epi32(p));
      // The pooling's backward writes 0 + dy, a -0 as +0; packed as -0 it changes no sum, which
      // starts from +0 (+0 + -0 is +0).
      if constexpr (sizeof(TD) == 2) {
        return _mm256_maskz_loadu_epi16(chosen, d + i);
      } else {
        return _mm512_maskz_cvtepi32_epi16(0xffff,
                                           ops::bf16_round16(_mm512_maskz_loadu_ps(chosen, d + i)));
      }
    }
  }
  /// The same for one channel (the scalar path).
  [[gnu::always_inline]] uint16_t load1(const TD* d, const int32_t* am, int64_t t,
                                        int32_t p) const {
    if constexpr (!kPooled) {
      (void)am, (void)t;
      return p >= 0 ? to_bf16(d[p * block]) : uint16_t{0};
    } else {
      const int32_t w = pooled[t];
      if (w < 0 || am[w * block] != p) return uint16_t{0};
      return to_bf16(d[w * block]);
    }
  }
};

/// dy's positions in pairs, [Tpad / 2][K] words, zero where `pos` is -1; each filter's sum of the
/// packed values added to bias when it is not null. t0: the first position's index in pos.
template <typename TD, bool kPooled>
void pack_dy(int64_t Q, int64_t K, const DySource<TD, kPooled>& source, int64_t t0,
             const int32_t* pos, uint32_t* dyp, float* bias) {
  // A copy no store can reach: read through the reference, its fields were loaded again after
  // every vector store (which may alias anything).
  const DySource<TD, kPooled> src = source;
  if (src.block % kLanes == 0) {
    // The bias sums on dot products with pairs of ones: one instruction adds both positions.
    const auto ones = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));
    constexpr int64_t kMaxVectors = 16;  // bias sums in registers: K up to 256 at once
    for (int64_t kb = 0; kb < K; kb += kMaxVectors * kLanes) {
      const int64_t vectors = std::min(kMaxVectors, (K - kb) / kLanes);
      __m512 sum[kMaxVectors];
      const TD* bases[kMaxVectors];
      const int32_t* argmaxes[kMaxVectors];
      for (int64_t v = 0; v < vectors; ++v) {
        sum[v] = _mm512_setzero_ps();
        bases[v] = src.dy_at(kb + v * kLanes);
        argmaxes[v] = src.argmax_at(kb + v * kLanes);
      }
      for (int64_t q = 0; q < Q; ++q) {
        const int64_t t = t0 + 2 * q;
        const int32_t p0 = pos[t], p1 = pos[t + 1];
        for (int64_t v = 0; v < vectors; ++v) {
          const __m512i pairs = interleave(src.load(bases[v], argmaxes[v], t, p0),
                                           src.load(bases[v], argmaxes[v], t + 1, p1));
          _mm512_storeu_si512(dyp + q * K + kb + v * kLanes, pairs);
          sum[v] = _mm512_dpbf16_ps(sum[v], reinterpret_cast<__m512bh>(pairs), ones);
        }
      }
      if (bias != nullptr)
        for (int64_t v = 0; v < vectors; ++v) {
          float* b = bias + kb + v * kLanes;
          _mm512_storeu_ps(b, _mm512_add_ps(_mm512_loadu_ps(b), sum[v]));
        }
    }
    return;
  }
  for (int64_t k = 0; k < K; ++k) {
    const TD* d = src.dy_at(k);
    const int32_t* am = src.argmax_at(k);
    float s = 0.0f;
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t t = t0 + 2 * q;
      const uint16_t a = src.load1(d, am, t, pos[t]);
      const uint16_t b = src.load1(d, am, t + 1, pos[t + 1]);
      dyp[q * K + k] = pair(a, b);
      s += widened(a);
      s += widened(b);
    }
    if (bias != nullptr) bias[k] += s;
  }
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

/// Tiles (mt .. mt + MT - 1) x (nt .. nt + NT - 1) of the sums over one sample's positions. The
/// sums in tiles 0-3 (C[i][j] in tile 2 i + j), A in 4-5, B in 6-7; a0 and a1 are the A tiles'
/// first rows, a_stride bytes apart, `steps` runs of 32 positions; b the B tiles' first word, c
/// the first sum, rows K floats apart.
template <int MT, int NT>
void tile_group(const uint16_t* a0, const uint16_t* a1, int64_t a_stride, const uint32_t* b,
                int64_t K, int64_t steps, float* c, bool first) {
  const int64_t row = K * 4;
  float* c1 = c + amx::kRows * K;
  if (first) {
    _tile_zero(0);
    if constexpr (NT > 1) _tile_zero(1);
    if constexpr (MT > 1) _tile_zero(2);
    if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  } else {
    _tile_loadd(0, c, row);
    if constexpr (NT > 1) _tile_loadd(1, c + amx::kPairs, row);
    if constexpr (MT > 1) _tile_loadd(2, c1, row);
    if constexpr (MT > 1 && NT > 1) _tile_loadd(3, c1 + amx::kPairs, row);
  }
  for (int64_t st = 0; st < steps; ++st) {
    const uint32_t* bq = b + st * amx::kRows * K;
    _tile_loadd(6, bq, row);
    if constexpr (NT > 1) _tile_loadd(7, bq + amx::kPairs, row);
    _tile_loadd(4, a0 + st * amx::kDepth, a_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT > 1) {
      _tile_loadd(5, a1 + st * amx::kDepth, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, row);
  if constexpr (NT > 1) _tile_stored(1, c + amx::kPairs, row);
  if constexpr (MT > 1) _tile_stored(2, c1, row);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, c1 + amx::kPairs, row);
}

#pragma GCC pop_options

template <typename TD, typename TX>
void bwd_weights(const ConvGeom& g, int64_t K, const TD* dy, int64_t dy_block,
                 const PooledGrad* pool, const TX* x, int64_t x_block, int64_t n0, int64_t n1,
                 float* out, float* bias, float* scratch) {
  const Plan pl(g, K);
  float* acc = scratch;  // [Mpad][K], rows in the product's order
  auto* dyp = reinterpret_cast<uint32_t*>(scratch + pl.dy_at);
  auto* pos = reinterpret_cast<int32_t*>(scratch + pl.pos_at);
  auto* pooled = reinterpret_cast<int32_t*>(scratch + pl.pooled_at);
  auto* xp = reinterpret_cast<uint16_t*>(scratch + pl.planes_at);
  auto* rows = reinterpret_cast<uint16_t*>(scratch + pl.rows_at);
  const int64_t P = pool ? pool->POH * pool->POW : g.OH * g.OW, dy_sample = K * P,
                x_sample = g.C * g.H * g.W;
  std::fill_n(pos, pl.Tpad, -1);
  if (pool != nullptr) std::fill_n(pooled, pl.Tpad, -1);
  for (int64_t oh = 0; oh < g.OH; ++oh)
    for (int64_t ow = 0; ow < g.OW; ++ow) {
      const int64_t t = oh * pl.WP + ow;
      pos[t] = static_cast<int32_t>(oh * g.OW + ow);
      if (pool == nullptr) continue;
      // The window covering (oh, ow), if any: windows do not overlap and have no padding.
      const int64_t wh = oh / pool->SH, ww = ow / pool->SW;
      if (wh < pool->POH && ww < pool->POW && oh - wh * pool->SH < pool->KH &&
          ow - ww * pool->SW < pool->KW)
        pooled[t] = static_cast<int32_t>(wh * pool->POW + ww);
    }
  const int64_t seg_t = pl.seg * amx::kDepth;
  if (!pl.planes) std::fill_n(rows + pl.M * seg_t, (pl.Mpad - pl.M) * seg_t, uint16_t{0});
  const int64_t m_tiles = pl.Mpad / amx::kRows, n_tiles = K / amx::kPairs,
                c_tiles = g.C / amx::kRows;
  // A tile mt's first row for the segment from position t0, and the bytes between its rows.
  const auto a_row = [&](int64_t mt, int64_t t0) -> const uint16_t* {
    if (!pl.planes) return rows + mt * amx::kRows * seg_t;
    const int64_t rs = mt / c_tiles, c0 = mt % c_tiles * amx::kRows;
    return xp + c0 * pl.L + rs / g.KW * pl.WP + rs % g.KW + t0;
  };
  const int64_t a_stride = 2 * (pl.planes ? pl.L : seg_t);
  amx::configure();
  for (int64_t n = n0; n < n1; ++n) {
    const TX* xn = x + n * x_sample;
    if constexpr (sizeof(TX) == 2) {
      if (x_block % kLanes == 0 && g.C % kLanes == 0) {
        pack_planes_blocked(g, pl, xn, x_block, xp);
      } else if (x_block > 1 && x_block <= 4 && g.C % x_block == 0) {
        pack_planes_narrow(g, pl, xn, x_block, xp);
      } else {
        pack_planes_portable(g, pl, xn, x_block, xp);
      }
    } else {
      pack_planes_portable(g, pl, xn, x_block, xp);
    }
    for (int64_t t0 = 0; t0 < pl.Tpad; t0 += seg_t) {
      const int64_t len = std::min(seg_t, pl.Tpad - t0), steps = len / amx::kDepth;
      if (pool == nullptr) {
        pack_dy(len / 2, K,
                DySource<TD, false>{.dy = dy + n * dy_sample, .block = dy_block, .plane = P}, t0,
                pos, dyp, bias);
      } else {
        const auto* am = pool->argmax + n * dy_sample;
        pack_dy(len / 2, K,
                DySource<TD, true>{.dy = dy + n * dy_sample,
                                   .block = dy_block,
                                   .plane = P,
                                   .argmax = am,
                                   .pooled = pooled},
                t0, pos, dyp, bias);
      }
      if (!pl.planes)  // row (c, r, s): channel c's run from r WP + s
        for (int64_t m = 0; m < pl.M; ++m) {
          const int64_t c = m / (g.KH * g.KW), r = m / g.KW % g.KH, s = m % g.KW;
          std::memcpy(rows + m * seg_t, xp + c * pl.L + r * pl.WP + s + t0,
                      static_cast<std::size_t>(len) * sizeof(uint16_t));
        }
      const bool first = n == n0 && t0 == 0;
      for (int64_t mt = 0; mt < m_tiles; mt += 2)
        for (int64_t nt = 0; nt < n_tiles; nt += 2) {
          const bool two_m = mt + 1 < m_tiles, two_n = nt + 1 < n_tiles;
          const uint16_t* a0 = a_row(mt, t0);
          const uint16_t* a1 = two_m ? a_row(mt + 1, t0) : a0;
          const uint32_t* b = dyp + nt * amx::kPairs;
          float* c = acc + mt * amx::kRows * K + nt * amx::kPairs;
          if (two_m && two_n) {
            tile_group<2, 2>(a0, a1, a_stride, b, K, steps, c, first);
          } else if (two_m) {
            tile_group<2, 1>(a0, a1, a_stride, b, K, steps, c, first);
          } else if (two_n) {
            tile_group<1, 2>(a0, a1, a_stride, b, K, steps, c, first);
          } else {
            tile_group<1, 1>(a0, a1, a_stride, b, K, steps, c, first);
          }
        }
    }
  }
  // Out in (c, r, s) order: the planes' product has its rows in (r, s, c) order.
  if (!pl.planes) {
    std::memcpy(out, acc, static_cast<std::size_t>(pl.M * K) * sizeof(float));
    return;
  }
  const int64_t window = g.KH * g.KW;
  for (int64_t rs = 0; rs < window; ++rs)
    for (int64_t c = 0; c < g.C; ++c)
      std::memcpy(out + (c * window + rs) * K, acc + (rs * g.C + c) * K,
                  static_cast<std::size_t>(K) * sizeof(float));
}

// ---- the forward and the data gradient ----------------------------------------------------------

/// The sizes of the forward's packs (conv_amx.hpp).
struct FwdPlan {
  int64_t WP = 0, HP = 0;         // padded input width and height
  int64_t span = 0;               // values of a window row: KW * C
  int64_t J = 0;                  // runs of 32 over a window row
  int64_t CW = 0;                 // chunks of 16 positions per output row
  int64_t xpad = 0;               // halves of the padded input, with the runs' overhang
  int64_t stage_at = 0, end = 0;  // scratch, in floats

  FwdPlan(const ConvGeom& g, int64_t K) {
    (void)K;
    WP = g.W + 2 * g.PW;
    HP = g.H + 2 * g.PH;
    span = g.KW * g.C;
    J = (span + amx::kDepth - 1) / amx::kDepth;
    CW = (g.OW + amx::kRows - 1) / amx::kRows;
    // The last chunk's runs start at most 15 positions past the last output column and read
    // 32 J values: beyond the plane when the row is the last one.
    xpad = round_up(HP * WP * g.C + amx::kRows * g.C + J * amx::kDepth, amx::kDepth);
    stage_at = round_up(xpad / 2, 16);
    end = stage_at + 4 * amx::kRows * amx::kPairs;
  }
};

/// w'[k][u = s C + c][r] of the product: w[k][c][r][s], or for the data gradient
/// w[c][k][KH - 1 - r][KW - 1 - s].
template <typename TW>
void pack_weights(const ConvGeom& g, int64_t K, const TW* w, bool transposed, uint16_t* packed) {
  const FwdPlan pl(g, K);
  const int64_t window = g.KH * g.KW, step = transposed ? window : g.C * window;
  for (int64_t r = 0; r < g.KH; ++r)
    for (int64_t j = 0; j < pl.J; ++j)
      for (int64_t q = 0; q < amx::kPairs; ++q)
        for (int64_t e = 0; e < 2; ++e) {
          uint16_t* dst = packed + ((r * pl.J + j) * amx::kPairs + q) * K * 2 + e;
          const int64_t u = j * amx::kDepth + 2 * q + e, s = u / g.C, c = u % g.C;
          if (u >= pl.span) {
            for (int64_t k = 0; k < K; ++k) dst[2 * k] = 0;
            continue;
          }
          const TW* src = w + (transposed ? (c * K * g.KH + g.KH - 1 - r) * g.KW + g.KW - 1 - s
                                          : (c * g.KH + r) * g.KW + s);
          for (int64_t k = 0; k < K; ++k) dst[2 * k] = to_bf16(src[k * step]);
        }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")

/// Rows 0 .. H - 1 of at most 4 plain bf16 channels (planes P values apart, rows W values) into
/// the rows at row(h), interleaved (value (c, w) at w C + c): per 32 positions, each output
/// vector takes its values from the C channel rows with one permutation each (the same
/// positions, a channel's lanes masked). The CIFAR CNN's image (3 channels, nchw) for its first
/// convolution: value by value it took 2.3% of the bf16 step's CPU time.
template <typename Row>
void interleave_rows(const uint16_t* x, int64_t P, int64_t C, int64_t H, int64_t W, Row&& row) {
  // The permutation and lanes of output vector k of a run of n positions (n = 32, and W % 32).
  struct Run {
    __m512i at[4];
    __mmask32 lanes[4][4], store[4];
    int64_t vectors;
  };
  const auto run = [&](int64_t n) {
    Run r{};
    r.vectors = (n * C + 31) / 32;
    for (int64_t k = 0; k < r.vectors; ++k) {
      alignas(64) uint16_t idx[32];
      for (int64_t i = 0; i < 32; ++i) {
        const int64_t o = 32 * k + i;
        idx[i] = static_cast<uint16_t>(o / C % 32);
        if (o < n * C) {
          r.lanes[k][o % C] |= __mmask32{1} << i;
          r.store[k] |= __mmask32{1} << i;
        }
      }
      r.at[k] = _mm512_load_si512(idx);
    }
    return r;
  };
  const Run full = run(32), tail = run(W % 32);
  for (int64_t h = 0; h < H; ++h) {
    uint16_t* dst = row(h);
    for (int64_t w0 = 0; w0 < W; w0 += 32) {
      const int64_t n = std::min<int64_t>(32, W - w0);
      const Run& r = n == 32 ? full : tail;
      const auto in_mask = static_cast<__mmask32>(n == 32 ? ~0u : (1u << n) - 1);
      __m512i rows[4];
      for (int64_t c = 0; c < C; ++c)
        rows[c] = _mm512_maskz_loadu_epi16(in_mask, x + c * P + h * W + w0);
      for (int64_t k = 0; k < r.vectors; ++k) {
        __m512i v = _mm512_setzero_si512();
        for (int64_t c = 0; c < C; ++c)
          v = _mm512_mask_permutexvar_epi16(v, r.lanes[k][c], r.at[k], rows[c]);
        _mm512_mask_storeu_epi16(dst + w0 * C + 32 * k, r.store[k], v);
      }
    }
  }
}

#pragma GCC pop_options

/// x's sample into the padded nhwc rows: value (c, h, w) at ((h + PH) WP + w + PW) C + c, and
/// zero between the rows' values (the padding, and the runs' overhang past the last row). Only
/// those gaps are cleared: clearing the whole pack first wrote it twice (the CIFAR CNN's second
/// layer: 20 KiB per sample, in its forward and its data gradient).
template <typename T>
void pack_rows(const ConvGeom& g, const FwdPlan& pl, const T* x, int64_t block, uint16_t* xp) {
  const int64_t P = g.H * g.W;
  const auto row = [&](int64_t h) { return xp + ((h + g.PH) * pl.WP + g.PW) * g.C; };
  uint16_t* gap = xp;  // the first half of the current gap
  for (int64_t h = 0; h < g.H; ++h) {
    std::fill(gap, row(h), uint16_t{0});
    gap = row(h) + g.W * g.C;
  }
  std::fill(gap, xp + pl.xpad, uint16_t{0});
  if constexpr (sizeof(T) == 2) {
    if (block == g.C) {  // nhwc: the rows as they are
      for (int64_t h = 0; h < g.H; ++h)
        std::memcpy(row(h), x + h * g.W * g.C, static_cast<std::size_t>(g.W * g.C) * sizeof(T));
      return;
    }
    if (block == 1 && g.C <= 4) return interleave_rows(x, P, g.C, g.H, g.W, row);
  }
  for (int64_t h = 0; h < g.H; ++h)
    for (int64_t c = 0; c < g.C; ++c) {
      const T* src = x + channel_offset(c, block, P) + h * g.W * block;
      for (int64_t w = 0; w < g.W; ++w) row(h)[w * g.C + c] = to_bf16(src[w * block]);
    }
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

/// Two chunks of 16 positions (a0, a1: their first runs, rows `a_stride` bytes apart) by two
/// tiles of 16 output channels (b: the first's packed weights) into stage [4][16][16]: sums in
/// tiles 0-3, A in 4-5, B in 6-7. `rows` window rows, `runs` runs of 32 per window row; a row of
/// the window is `row` halves further on in the input, `b_row` halves in the weights.
template <int MT, int NT>
void fwd_group(const uint16_t* a0, const uint16_t* a1, int64_t a_stride, int64_t row,
               const uint16_t* b, int64_t K, int64_t rows, int64_t runs, float* stage) {
  const int64_t b_stride = K * 4, b_run = amx::kPairs * K * 2;
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (MT > 1) _tile_zero(2);
  if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < runs; ++j) {
      const uint16_t* bq = b + (r * runs + j) * b_run;
      const int64_t at = r * row + j * amx::kDepth;
      _tile_loadd(6, bq, b_stride);
      if constexpr (NT > 1) _tile_loadd(7, bq + 2 * amx::kPairs, b_stride);
      _tile_loadd(4, a0 + at, a_stride);
      _tile_dpbf16ps(0, 4, 6);
      if constexpr (NT > 1) _tile_dpbf16ps(1, 4, 7);
      if constexpr (MT > 1) {
        _tile_loadd(5, a1 + at, a_stride);
        _tile_dpbf16ps(2, 5, 6);
        if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
      }
    }
  constexpr int64_t kTile = amx::kRows * amx::kPairs, kRow = amx::kPairs * 4;
  _tile_stored(0, stage, kRow);
  if constexpr (NT > 1) _tile_stored(1, stage + kTile, kRow);
  if constexpr (MT > 1) _tile_stored(2, stage + 2 * kTile, kRow);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, stage + 3 * kTile, kRow);
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

/// Staged tiles [16 positions][16 channels] of one chunk, `tiles` (1 or 2) side by side
/// (`tile_stride` floats apart), + bias and ReLU, into y at positions p0 .. p0 + n - 1 (one output
/// row), channels k0 .. k0 + 16 tiles - 1: in nhwc-like layouts a row of both tiles is one
/// conversion (vcvtne2ps2bf16, rounding to nearest even as ops::bf16_round) and one store.
template <bool kRelu, typename TY>
void store_tiles(const float* stage, int64_t tile_stride, int tiles, const float* bias, int64_t k0,
                 int64_t n, int64_t p0, int64_t P, TY* y, int64_t block) {
  __m512 b[2];
  for (int t = 0; t < 2; ++t)
    b[t] = bias != nullptr && t < tiles ? _mm512_loadu_ps(bias + k0 + t * kLanes)
                                        : _mm512_setzero_ps();
  const auto value = [&](int64_t i, int t) {
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(stage + t * tile_stride + i * amx::kPairs), b[t]);
    if constexpr (kRelu) v = _mm512_maskz_max_ps(0xffff, v, _mm512_setzero_ps());
    return v;
  };
  // Both tiles' 32 channels side by side (nhwc, or 32 of a wider block).
  const bool contiguous = block % (tiles * kLanes) == 0 && k0 % block + tiles * kLanes <= block;
  if (contiguous) {
    TY* base = y + (k0 - k0 % block) * P + k0 % block + p0 * block;
    for (int64_t i = 0; i < n; ++i) {
      TY* at = base + i * block;
      if constexpr (sizeof(TY) == 2) {
        if (tiles == 2) {
          _mm512_storeu_si512(
              at, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(value(i, 1), value(i, 0))));
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(at),
                              reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(value(i, 0))));
        }
      } else {
        for (int t = 0; t < tiles; ++t) _mm512_storeu_ps(at + t * kLanes, value(i, t));
      }
    }
    return;
  }
  for (int t = 0; t < tiles; ++t)
    for (int64_t i = 0; i < n; ++i) {
      alignas(64) float lanes[kLanes];
      _mm512_store_ps(lanes, value(i, t));
      for (int64_t k = 0; k < kLanes; ++k) {
        TY* e = y + channel_offset(k0 + t * kLanes + k, block, P) + (p0 + i) * block;
        if constexpr (sizeof(TY) == 2) {
          *e = ops::bf16_round(lanes[k]);
        } else {
          *e = lanes[k];
        }
      }
    }
}

#pragma GCC pop_options

template <typename TX, typename TY>
void forward(const ConvGeom& g, int64_t K, const TX* x, int64_t x_block, const uint16_t* packed,
             const float* bias, bool relu, TY* y, int64_t y_block, int64_t n0, int64_t n1,
             float* scratch) {
  const FwdPlan pl(g, K);
  auto* xp = reinterpret_cast<uint16_t*>(scratch);
  float* stage = scratch + pl.stage_at;
  const int64_t P = g.OH * g.OW, chunks = g.OH * pl.CW, n_tiles = K / amx::kPairs;
  constexpr int64_t kTile = amx::kRows * amx::kPairs;
  // Chunk i: output row i / CW, columns from 16 (i % CW); its runs start at input row oh (+ r).
  const auto first_run = [&](int64_t i) {
    return xp + (i / pl.CW * pl.WP + i % pl.CW * amx::kRows) * g.C;
  };
  amx::configure();
  for (int64_t n = n0; n < n1; ++n) {
    pack_rows(g, pl, x + n * g.C * g.H * g.W, x_block, xp);
    TY* yn = y + n * K * P;
    // Pairs of output channel tiles outer: their packed weights (a pair's 18 KiB for the CIFAR
    // CNN's second layer) stay in the first-level cache beside the input's pack over all the
    // chunks (the second layer's forward with pool2 167-172 against 174-175 us per step with the
    // chunks outer, all 36 KiB of weights read for each chunk).
    for (int64_t nt = 0; nt < n_tiles; nt += 2) {
      const bool two_n = nt + 1 < n_tiles;
      for (int64_t i = 0; i < chunks; i += 2) {
        const bool two_m = i + 1 < chunks;
        const uint16_t* a0 = first_run(i);
        const uint16_t* a1 = two_m ? first_run(i + 1) : a0;
        const uint16_t* b = packed + nt * amx::kPairs * 2;
        const int64_t a_stride = 2 * g.C, row = pl.WP * g.C;
        if (two_m && two_n) {
          fwd_group<2, 2>(a0, a1, a_stride, row, b, K, g.KH, pl.J, stage);
        } else if (two_m) {
          fwd_group<2, 1>(a0, a1, a_stride, row, b, K, g.KH, pl.J, stage);
        } else if (two_n) {
          fwd_group<1, 2>(a0, a1, a_stride, row, b, K, g.KH, pl.J, stage);
        } else {
          fwd_group<1, 1>(a0, a1, a_stride, row, b, K, g.KH, pl.J, stage);
        }
        for (int64_t m = 0; m < (two_m ? 2 : 1); ++m) {
          const int64_t ci = i + m, ow0 = ci % pl.CW * amx::kRows;
          const int64_t len = std::min(amx::kRows, g.OW - ow0), p0 = ci / pl.CW * g.OW + ow0;
          const float* st = stage + 2 * m * kTile;
          const int tiles = two_n ? 2 : 1;
          if (relu) {
            store_tiles<true>(st, kTile, tiles, bias, nt * amx::kPairs, len, p0, P, yn, y_block);
          } else {
            store_tiles<false>(st, kTile, tiles, bias, nt * amx::kPairs, len, p0, P, yn, y_block);
          }
        }
      }
    }
  }
}

#endif  // __x86_64__

}  // namespace

int64_t conv_amx_scratch_floats(const ConvGeom& g, int64_t K) { return Plan(g, K).end; }

void conv_amx_bwd_weights(const ConvGeom& g, int64_t K, const void* dy, ActLayout dy_layout,
                          const void* x, ActLayout x_layout, int64_t n0, int64_t n1, float* acc,
                          float* bias_acc, float* scratch) {
#if defined(__x86_64__)
  dot_bf16::with_stored(dy, dy_layout.bf16, x, x_layout.bf16, [&](const auto* d, const auto* xs) {
    bwd_weights(g, K, d, dy_layout.block, nullptr, xs, x_layout.block, n0, n1, acc, bias_acc,
                scratch);
  });
#else
  (void)g, (void)K, (void)dy, (void)dy_layout, (void)x, (void)x_layout, (void)n0, (void)n1;
  (void)acc, (void)bias_acc, (void)scratch;
#endif
}

void conv_amx_bwd_weights_pooled(const ConvGeom& g, int64_t K, const PooledGrad& dy, const void* x,
                                 ActLayout x_layout, int64_t n0, int64_t n1, float* acc,
                                 float* bias_acc, float* scratch) {
#if defined(__x86_64__)
  dot_bf16::with_stored(dy.dy, dy.layout.bf16, x, x_layout.bf16,
                        [&](const auto* d, const auto* xs) {
                          bwd_weights(g, K, d, dy.layout.block, &dy, xs, x_layout.block, n0, n1,
                                      acc, bias_acc, scratch);
                        });
#else
  (void)g, (void)K, (void)dy, (void)x, (void)x_layout, (void)n0, (void)n1;
  (void)acc, (void)bias_acc, (void)scratch;
#endif
}

int64_t conv_amx_forward_scratch_floats(const ConvGeom& g, int64_t K) { return FwdPlan(g, K).end; }

int64_t conv_amx_weight_halves(const ConvGeom& g, int64_t K) {
  return g.KH * FwdPlan(g, K).J * amx::kPairs * K * 2;
}

void conv_amx_pack_weights(const ConvGeom& g, int64_t K, AmxConvWeights w, uint16_t* packed) {
#if defined(__x86_64__)
  dot_bf16::with_stored(w.data, w.bf16,
                        [&](const auto* ws) { pack_weights(g, K, ws, w.transposed, packed); });
#else
  (void)g, (void)K, (void)w, (void)packed;
#endif
}

void conv_amx_forward(const ConvGeom& g, int64_t K, const void* x, ActLayout x_layout,
                      const uint16_t* packed_w, const float* bias, bool relu, void* y,
                      ActLayout y_layout, int64_t n0, int64_t n1, float* scratch) {
#if defined(__x86_64__)
  dot_bf16::with_stored(x, x_layout.bf16, y, y_layout.bf16, [&](const auto* xs, auto* ys) {
    forward(g, K, xs, x_layout.block, packed_w, bias, relu, ys, y_layout.block, n0, n1, scratch);
  });
#else
  (void)g, (void)K, (void)x, (void)x_layout, (void)packed_w, (void)bias, (void)relu, (void)y;
  (void)y_layout, (void)n0, (void)n1, (void)scratch;
#endif
}

}  // namespace minidl::native
