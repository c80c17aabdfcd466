#include "minidl/ops/native/gemm_bf16.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

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

using dot_bf16::kLanes;
using dot_bf16::kMaxRows;
using dot_bf16::kMaxVectors;
using dot_bf16::tile_rows;

inline uint16_t bits_at(Bf16Factor f, int64_t i) {
  if (f.bf16) return static_cast<const uint16_t*>(f.data)[i];
  return dot_bf16::to_bf16(static_cast<const float*>(f.data)[i]);
}

#if defined(__x86_64__)

// GCC 12's unmasked forms of some intrinsics start from an undefined vector and trip
// -Wmaybe-uninitialized: the masked forms with every lane selected are used instead.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

/// 16 values at i as bf16 bits.
__attribute__((always_inline)) inline __m256i load16(Bf16Factor f, int64_t i) {
  if (f.bf16) return dot_bf16::load16(static_cast<const uint16_t*>(f.data) + i);
  return dot_bf16::load16(static_cast<const float*>(f.data) + i);
}

using dot_bf16::interleave;

/// Column blocks of 64 (the last one narrower) each hold their pairs of rows together: the
/// words of block c0, (b[2q][j], b[2q + 1][j]), at c0 * Q + q * width + (j - c0), so a tile reads
/// one contiguous run rather than a strip of rows N words apart.
void pack(int64_t B, int64_t N, Bf16Factor b, uint32_t* packed) {
  const int64_t Q = (B + 1) / 2, block = kMaxVectors * kLanes;
  for (int64_t c0 = 0; c0 < N; c0 += block) {
    const int64_t width = std::min(block, N - c0);
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t r = 2 * q;
      for (int64_t j = c0; j < c0 + width; j += kLanes) {
        const __m256i lo = load16(b, r * N + j);
        const __m256i hi = r + 1 < B ? load16(b, (r + 1) * N + j) : _mm256_setzero_si256();
        _mm512_storeu_si512(packed + c0 * Q + q * width + (j - c0), interleave(lo, hi));
      }
    }
  }
}

/// Rows [i0, i0 + R) by columns [j0, j0 + 16 V) of g, into g (row stride N: g's, ldg). `pairs`
/// holds each row's words of a, Q apiece.
template <int R, int V>
void tile(int64_t Q, int64_t N, const uint32_t* pairs, const uint32_t* packed_b, float* g,
          int64_t j0) {
  __m512 acc[R][V];
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  const uint32_t* block = packed_b + j0 * Q;
  for (int64_t q = 0; q < Q; ++q) {
    __m512bh bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(block + q * V * kLanes + v * kLanes));
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      const __m512bh a =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pairs[i * Q + q])));
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], bv[v], a);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(g + i * N + j0 + v * kLanes, acc[i][v]);
}

using TileFn = void (*)(int64_t, int64_t, const uint32_t*, const uint32_t*, float*, int64_t);

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

// ---- AMX tiles ----------------------------------------------------------------------------------
// b in pairs of rows again, each 16 columns' pairs together ([N / 16][Qt][16] words, Qt = Q
// rounded up to 16 with zero pairs), so that a B tile (16 pairs of 16 columns) is 1 KiB in one
// run; a block of 16 rows of g takes a's columns i0 .. i0 + 15 as the rows of an A tile, the
// batch along them (zero after it).

/// Pairs of rows of b in the AMX pack: whole tiles of 16.
int64_t amx_pairs(int64_t B) { return ((B + 1) / 2 + amx::kRows - 1) / amx::kRows * amx::kRows; }

void amx_pack(int64_t B, int64_t N, Bf16Factor b, uint32_t* packed) {
  const int64_t Q = (B + 1) / 2, Qt = amx_pairs(B);
  for (int64_t j = 0; j < N; j += kLanes) {
    uint32_t* out = packed + j * Qt;
    for (int64_t q = 0; q < Qt; ++q) {
      const int64_t r = 2 * q;
      const __m256i lo = q < Q ? load16(b, r * N + j) : _mm256_setzero_si256();
      const __m256i hi = r + 1 < B ? load16(b, (r + 1) * N + j) : _mm256_setzero_si256();
      _mm512_storeu_si512(out + q * kLanes, interleave(lo, hi));
    }
  }
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

/// Columns [j, j + 16 NT) of a block of 16 rows of g (row stride N) from the A tiles at `a`
/// (rows 2 Qt halves long) and the packed B: sums in tiles 0-1, A in 4, B in 6-7.
template <int NT>
void amx_columns(int64_t Qt, int64_t ldg, const uint16_t* a, const uint32_t* packed, float* g,
                 int64_t j) {
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  const uint32_t* b0 = packed + j * Qt;
  const uint32_t* b1 = b0 + kLanes * Qt;
  for (int64_t q = 0; q < Qt; q += amx::kRows) {
    _tile_loadd(4, a + 2 * q, 4 * Qt);
    _tile_loadd(6, b0 + q * kLanes, amx::kRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) {
      _tile_loadd(7, b1 + q * kLanes, amx::kRowBytes);
      _tile_dpbf16ps(1, 4, 7);
    }
  }
  _tile_stored(0, g + j, ldg * 4);
  if constexpr (NT > 1) _tile_stored(1, g + j + kLanes, ldg * 4);
}

#pragma GCC pop_options

/// A's rows for rows [i0, i1) of g: row i holds a[k][i0 + i] for k < B, zero after it and in
/// rows past i1 ([16][2 Qt] halves).
void amx_pack_rows(int64_t B, int64_t M, Bf16Factor a, int64_t i0, int64_t i1, uint16_t* at) {
  const int64_t K = 2 * amx_pairs(B);
  std::fill_n(at, amx::kRows * K, uint16_t{0});
  for (int64_t i = 0; i < i1 - i0; ++i)
    for (int64_t k = 0; k < B; ++k) at[i * K + k] = bits_at(a, k * M + i0 + i);
}

void amx_block(int64_t B, const uint16_t* at, const uint32_t* packed, float* g, int64_t ldg,
               int64_t j0, int64_t j1) {
  const int64_t Qt = amx_pairs(B);
  // Rows past the block's of the tiles land in g's rows after them: the caller's holds 16.
  amx::configure();
  float* g0 = g - j0;  // column j at g0 + j
  int64_t j = j0;
  for (; j + 2 * kLanes <= j1; j += 2 * kLanes) amx_columns<2>(Qt, ldg, at, packed, g0, j);
  if (j < j1) amx_columns<1>(Qt, ldg, at, packed, g0, j);
}

#endif  // __x86_64__

}  // namespace

namespace {
bool use_amx() {
  static const bool amx = amx_bf16_unavailable().empty();
  return amx;
}
}  // namespace

std::string tn_bf16_refusal(bool trans_a, bool trans_b, int64_t N) {
  if (!use_amx())
    if (std::string why = dot_bf16_unavailable(); !why.empty())
      return fmt::format("{} (AMX: {})", why, amx_bf16_unavailable());
  if (!trans_a || trans_b) return "takes a^T b only (a linear layer's weight gradient)";
  if (N % kLanes != 0) return "takes products whose columns are a multiple of 16";
  return "";
}

int64_t tn_bf16_pack_words(int64_t B, int64_t N) {
#if defined(__x86_64__)
  if (use_amx()) return amx_pairs(B) * N;
#endif
  return (B + 1) / 2 * N;
}

void tn_bf16_pack(int64_t B, int64_t N, Bf16Factor b, uint32_t* packed) {
#if defined(__x86_64__)
  if (use_amx()) return amx_pack(B, N, b, packed);
  pack(B, N, b, packed);
#else
  (void)B, (void)N, (void)b, (void)packed;
#endif
}

int64_t tn_bf16_block_rows(int64_t N) {
  if (use_amx()) return amx::kRows;
  return tile_rows(static_cast<int>(std::clamp<int64_t>(N / kLanes, 1, kMaxVectors)));
}

int64_t tn_bf16_rows_pack_words(int64_t B) {
#if defined(__x86_64__)
  if (use_amx()) return amx::kRows * amx_pairs(B);
#endif
  return kMaxRows * ((B + 1) / 2);
}

void tn_bf16_pack_rows(int64_t B, int64_t M, Bf16Factor a, int64_t i0, int64_t i1, uint32_t* rows) {
#if defined(__x86_64__)
  if (use_amx()) return amx_pack_rows(B, M, a, i0, i1, reinterpret_cast<uint16_t*>(rows));
#endif
  // The rows' words of a: (a[2q][i], a[2q + 1][i]).
  const int64_t Q = (B + 1) / 2;
  for (int64_t i = 0; i < i1 - i0; ++i)
    for (int64_t q = 0; q < Q; ++q) {
      const uint16_t lo = bits_at(a, 2 * q * M + i0 + i);
      const uint16_t hi = 2 * q + 1 < B ? bits_at(a, (2 * q + 1) * M + i0 + i) : uint16_t{0};
      rows[i * Q + q] = dot_bf16::pair(lo, hi);
    }
}

void tn_bf16_block(int64_t B, int64_t R, const uint32_t* rows, const uint32_t* packed_b, float* g,
                   int64_t ldg, int64_t j0, int64_t j1) {
#if defined(__x86_64__)
  if (use_amx())
    return amx_block(B, reinterpret_cast<const uint16_t*>(rows), packed_b, g, ldg, j0, j1);
  const int64_t Q = (B + 1) / 2;
  for (int64_t c0 = j0; c0 < j1; c0 += kMaxVectors * kLanes) {
    const int V = static_cast<int>(std::min<int64_t>(kMaxVectors, (j1 - c0) / kLanes));
    kTiles[V - 1][R - 1](Q, ldg, rows, packed_b, g - j0, c0);
  }
#else
  (void)B, (void)R, (void)rows, (void)packed_b, (void)g, (void)ldg, (void)j0, (void)j1;
#endif
}

}  // namespace minidl::native
