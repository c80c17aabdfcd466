#include "minidl/ops/native/conv_bf16.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "minidl/ops/bf16_round.hpp"
#include "minidl/ops/native/dot_bf16.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace minidl::native {

using std::int64_t;
using std::uint16_t;
using std::uint32_t;

namespace {

using dot_bf16::kLanes;
using dot_bf16::kMaxRows;     // rows (c, r, s) of dw in a register tile
using dot_bf16::kMaxVectors;  // vectors of 16 filters in a register tile
using dot_bf16::pair;
using dot_bf16::tile_rows;
using dot_bf16::to_bf16;
using dot_bf16::widened;

/// How one sample's packing buffers lie: dy pairs [OH][J][K], x pairs [HP][JP][C] twice (even and
/// odd first columns).
struct Packed {
  int64_t J = 0, HP = 0, JP = 0;
  Packed(const ConvGeom& g) : J((g.OW + 1) / 2), HP(g.OH + g.KH - 1), JP(J + (g.KW - 1) / 2) {}
  int64_t dy_words(int64_t K, const ConvGeom& g) const { return g.OH * J * K; }
  int64_t x_words(const ConvGeom& g) const { return HP * JP * g.C; }
};

// ---- portable packing (any layout)
// ---------------------------------------------------------------

template <typename T>
void pack_dy_portable(const ConvGeom& g, int64_t K, const T* dy, int64_t block, const Packed& pk,
                      uint32_t* out, float* bias) {
  const int64_t P = g.OH * g.OW;
  for (int64_t k = 0; k < K; ++k) {
    const T* base = dy + channel_offset(k, block, P);  // position p at base[p * block]
    float s = 0.0f;
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t j = 0; j < pk.J; ++j) {
        const int64_t w0 = 2 * j, p = oh * g.OW + w0;
        const uint16_t a = to_bf16(base[p * block]);
        const uint16_t b = w0 + 1 < g.OW ? to_bf16(base[(p + 1) * block]) : uint16_t{0};
        out[(oh * pk.J + j) * K + k] = pair(a, b);
        s += widened(a);
        s += widened(b);
      }
    if (bias != nullptr) bias[k] += s;
  }
}

#if defined(__x86_64__)

// GCC 12's unmasked forms of some intrinsics start from an undefined vector and trip
// -Wmaybe-uninitialized: the masked forms with every lane selected are used instead.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#define MINIDL_INLINE __attribute__((always_inline)) inline

using dot_bf16::interleave;
using dot_bf16::load16;
using dot_bf16::to_bf16_row;

using dot_bf16::widen16;

template <typename T>
void pack_x_portable(const ConvGeom& g, const T* x, int64_t block, const Packed& pk, uint32_t* even,
                     uint32_t* odd, uint16_t* row) {
  const int64_t P = g.H * g.W, cols = 2 * pk.JP + 2;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t hp = 0; hp < pk.HP; ++hp) {
      // The padded row: column q holds input column q - PW, or 0.
      const int64_t h = hp - g.PH;
      std::fill_n(row, cols, uint16_t{0});
      if (h >= 0 && h < g.H) {
        const int64_t w0 = std::max<int64_t>(0, -g.PW), w1 = std::min(g.W, cols - g.PW);
        const T* src = x + channel_offset(c, block, P) + h * g.W * block;
        if (block == 1) {
          to_bf16_row(src + w0, w1 - w0, row + w0 + g.PW);
        } else {
          for (int64_t w = w0; w < w1; ++w) row[w + g.PW] = to_bf16(src[w * block]);
        }
      }
      for (int64_t j = 0; j < pk.JP; ++j) {
        even[(hp * pk.JP + j) * g.C + c] = pair(row[2 * j], row[2 * j + 1]);
        odd[(hp * pk.JP + j) * g.C + c] = pair(row[2 * j + 1], row[2 * j + 2]);
      }
    }
}

/// Packing from a layout with 16 channels side by side (block a multiple of 16).
template <typename T>
void pack_dy_blocked(const ConvGeom& g, int64_t K, const T* dy, int64_t block, const Packed& pk,
                     uint32_t* out, float* bias) {
  const int64_t P = g.OH * g.OW;
  for (int64_t k0 = 0; k0 < K; k0 += kLanes) {
    const T* base = dy + (k0 - k0 % block) * P + k0 % block;
    __m512 sum = _mm512_setzero_ps();
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t j = 0; j < pk.J; ++j) {
        const int64_t w0 = 2 * j, p = oh * g.OW + w0;
        const __m256i a = load16(base + p * block);
        const __m256i b = w0 + 1 < g.OW ? load16(base + (p + 1) * block) : _mm256_setzero_si256();
        _mm512_storeu_si512(out + (oh * pk.J + j) * K + k0, interleave(a, b));
        if (bias != nullptr) sum = _mm512_add_ps(_mm512_add_ps(sum, widen16(a)), widen16(b));
      }
    if (bias != nullptr)
      _mm512_storeu_ps(bias + k0, _mm512_add_ps(_mm512_loadu_ps(bias + k0), sum));
  }
}

template <typename T>
void pack_x_blocked(const ConvGeom& g, const T* x, int64_t block, const Packed& pk, uint32_t* even,
                    uint32_t* odd) {
  const int64_t P = g.H * g.W;
  for (int64_t c0 = 0; c0 < g.C; c0 += kLanes) {
    const T* base = x + (c0 - c0 % block) * P + c0 % block;
    for (int64_t hp = 0; hp < pk.HP; ++hp) {
      const int64_t h = hp - g.PH;
      const bool inside = h >= 0 && h < g.H;
      const auto column = [&](int64_t q) {  // padded column q
        const int64_t w = q - g.PW;
        return inside && w >= 0 && w < g.W ? load16(base + (h * g.W + w) * block)
                                           : _mm256_setzero_si256();
      };
      __m256i prev = column(0);
      for (int64_t j = 0; j < pk.JP; ++j) {
        const __m256i b = column(2 * j + 1), c = column(2 * j + 2);
        const int64_t at = (hp * pk.JP + j) * g.C + c0;
        _mm512_storeu_si512(even + at, interleave(prev, b));
        _mm512_storeu_si512(odd + at, interleave(b, c));
        prev = c;
      }
    }
  }
}

/// Rows [i0, i0 + R) of acc [rows][K], filters [k0, k0 + 16 V), over one packed sample: for every
/// output pair, V loads of dy and R broadcasts of x words, R * V dot products.
template <int R, int V>
void tile(const ConvGeom& g, int64_t K, const Packed& pk, const uint32_t* dyp,
          const uint32_t* const* rows, int64_t k0, bool first, float* acc) {
  __m512 sum[R][V];
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      sum[i][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + i * K + k0 + v * kLanes);
  const uint32_t* rp[R];
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i) rp[i] = rows[i];
  const int64_t row_step = pk.JP * g.C, pair_step = g.C;
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const uint32_t* d = dyp + oh * pk.J * K + k0;
    for (int64_t j = 0; j < pk.J; ++j) {
      __m512bh dv[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v)
        dv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(d + j * K + v * kLanes));
      const int64_t off = oh * row_step + j * pair_step;
#pragma GCC unroll 12
      for (int i = 0; i < R; ++i) {
        const __m512bh xb =
            reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(rp[i][off])));
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) sum[i][v] = _mm512_dpbf16_ps(sum[i][v], dv[v], xb);
      }
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc + i * K + k0 + v * kLanes, sum[i][v]);
}

using TileFn = void (*)(const ConvGeom&, int64_t, const Packed&, const uint32_t*,
                        const uint32_t* const*, int64_t, bool, float*);

template <int V, std::size_t... I>
constexpr std::array<TileFn, sizeof...(I)> tiles_of(std::index_sequence<I...>) {
  return {&tile<static_cast<int>(I) + 1, V>...};
}
/// kTiles[V - 1][R - 1] = tile<R, V>.
constexpr std::array<std::array<TileFn, kMaxRows>, kMaxVectors> kTiles = {
    tiles_of<1>(std::make_index_sequence<kMaxRows>()),
    tiles_of<2>(std::make_index_sequence<kMaxRows>()),
    tiles_of<3>(std::make_index_sequence<kMaxRows>()),
    tiles_of<4>(std::make_index_sequence<kMaxRows>())};

template <typename TD, typename TX>
void bwd_weights(const ConvGeom& g, int64_t K, const TD* dy, int64_t dy_block, const TX* x,
                 int64_t x_block, int64_t n0, int64_t n1, float* out, float* bias,
                 uint32_t* scratch) {
  const Packed pk(g);
  const int64_t rows = g.rows(), dy_sample = K * g.OH * g.OW, x_sample = g.C * g.H * g.W;
  // The sums stay in the calling thread's scratch until the last sample, then go to `out` once:
  // the chunks' accumulators lie side by side, and updated there sample by sample the sums ran
  // 1.3x slower on one of two threads (the neighbouring chunk's lines are pulled into the other
  // core's cache, it seems by its prefetcher).
  auto* acc = reinterpret_cast<float*>(scratch);
  uint32_t* dyp = scratch + rows * K;
  uint32_t* even = dyp + pk.dy_words(K, g);
  uint32_t* odd = even + pk.x_words(g);
  auto* row = reinterpret_cast<uint16_t*>(odd + pk.x_words(g));
  // Each row's first x word: row (c, r, s) reads pair j + s / 2 of padded row oh + r, from the
  // even buffer for even s, the odd one for odd s. The same for every sample.
  std::vector<const uint32_t*> first(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t c = i / (g.KH * g.KW), r = i / g.KW % g.KH, s = i % g.KW;
    first[i] = (s % 2 == 0 ? even : odd) + (r * pk.JP + s / 2) * g.C + c;
  }
  for (int64_t n = n0; n < n1; ++n) {
    const TD* dyn = dy + n * dy_sample;
    const TX* xn = x + n * x_sample;
    if (dy_block % kLanes == 0) {
      pack_dy_blocked(g, K, dyn, dy_block, pk, dyp, bias);
    } else {
      pack_dy_portable(g, K, dyn, dy_block, pk, dyp, bias);
    }
    if (x_block % kLanes == 0 && g.C % kLanes == 0) {
      pack_x_blocked(g, xn, x_block, pk, even, odd);
    } else {
      pack_x_portable(g, xn, x_block, pk, even, odd, row);
    }
    for (int64_t k0 = 0; k0 < K; k0 += kMaxVectors * kLanes) {
      const int V = static_cast<int>(std::min<int64_t>(kMaxVectors, (K - k0) / kLanes));
      // Tiles of near-equal rows: 27 rows in 3 x 9, not 12 + 12 + 3.
      const int64_t tiles = (rows + tile_rows(V) - 1) / tile_rows(V);
      const int R = static_cast<int>((rows + tiles - 1) / tiles);
      for (int64_t i0 = 0; i0 < rows; i0 += R) {
        const int r = static_cast<int>(std::min<int64_t>(R, rows - i0));
        kTiles[V - 1][r - 1](g, K, pk, dyp, first.data() + i0, k0, n == n0, acc + i0 * K);
      }
    }
  }
  std::memcpy(out, acc, static_cast<std::size_t>(rows * K) * sizeof(float));
}

#pragma GCC pop_options
#undef MINIDL_INLINE

#endif  // __x86_64__

}  // namespace

int64_t conv_bf16_scratch_words(const ConvGeom& g, int64_t K) {
  const Packed pk(g);
  // The sums, dy pairs, x pairs twice, and a padded row of bf16 (2 JP + 2 halves) for portable
  // packing.
  return g.rows() * K + pk.dy_words(K, g) + 2 * pk.x_words(g) + pk.JP + 1;
}

void conv_bf16_bwd_weights(const ConvGeom& g, int64_t K, const void* dy, ActLayout dy_layout,
                           const void* x, ActLayout x_layout, int64_t n0, int64_t n1, float* acc,
                           float* bias_acc, uint32_t* scratch) {
#if defined(__x86_64__)
  dot_bf16::with_stored(dy, dy_layout.bf16, x, x_layout.bf16, [&](const auto* d, const auto* xs) {
    bwd_weights(g, K, d, dy_layout.block, xs, x_layout.block, n0, n1, acc, bias_acc, scratch);
  });
#else
  (void)g, (void)K, (void)dy, (void)dy_layout, (void)x, (void)x_layout, (void)n0, (void)n1;
  (void)acc, (void)bias_acc, (void)scratch;
#endif
}

void conv_bf16_unpack(float* acc, int64_t parts, int64_t part_stride, int64_t rows, int64_t K,
                      float* dw, int64_t i0, int64_t i1) {
  for (int64_t j = i0 * K; j < i1 * K; ++j) {
    float s = acc[j];
    for (int64_t p = 1; p < parts; ++p) s += acc[p * part_stride + j];
    acc[j] = s;
  }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = i0; i < i1; ++i) dw[k * rows + i] = acc[i * K + k];
}

}  // namespace minidl::native
