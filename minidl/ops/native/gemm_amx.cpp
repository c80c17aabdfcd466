#include "minidl/ops/native/gemm_amx.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "minidl/core/threading.hpp"
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

// A factor read in place gives C at most this many rows (two groups of 2 x 2 tiles) when the
// other is packed inside the loop, a strip of column tiles right before the products that read
// it, in the second-level cache of the thread that packed it; otherwise all of it is packed first
// and shared by the threads.
constexpr int64_t kPackedInLoopRows = 2 * 2 * amx::kRows;
// A strip of column tiles packed at a time there: in L2, read across its rows.
constexpr int64_t kStripBytes = 128 * 1024;
// How many pairs of rows ahead that pack asks for the rows it reads.
constexpr int64_t kAheadPairs = 4;

// Otherwise the factor read in place must be the larger, since every call packs the other: the
// whole 2 MiB weight of fc1 packed ahead of its data gradient (a = dy in place) took 233 us per
// step against oneDNN's 141 for the whole product (--profile).
bool b_in_place(const AmxGemmShape& s) {
  return s.tb && s.b_bf16 && s.N % amx::kRows == 0 && (s.N >= s.M || s.N <= kPackedInLoopRows);
}
bool a_in_place(const AmxGemmShape& s) {
  return !s.ta && s.a_bf16 && s.M % amx::kRows == 0 && (s.M >= s.N || s.M <= kPackedInLoopRows);
}

/// How one call runs: C [rows][cols] = A [rows][K] (in place, rows K halves apart) B [K][cols]
/// (packed from the other factor); C is y, or y^T when `transposed`.
struct Plan {
  bool transposed = false;
  int64_t rows = 0, cols = 0, cols16 = 0, pairs = 0;
  // The packed factor's element (k, c) lies at k * sk + c * sc.
  int64_t sk = 0, sc = 0;

  explicit Plan(const AmxGemmShape& s) {
    transposed = b_in_place(s);
    rows = transposed ? s.N : s.M;
    cols = transposed ? s.M : s.N;
    cols16 = (cols + kLanes - 1) / kLanes * kLanes;
    pairs = s.K / 2;
    if (transposed) {  // B [k][m] = op(a)[m][k]: a [M, K], or [K, M] when ta
      sk = s.ta ? s.M : 1;
      sc = s.ta ? 1 : s.K;
    } else {  // B [k][n] = op(b)[k][n]: b [K, N], or [N, K] when tb
      sk = s.tb ? 1 : s.N;
      sc = s.tb ? s.K : 1;
    }
  }
  // Each column tile's pairs, and a line between tiles where they are packed inside the loop.
  int64_t pack_words() const { return cols16 * (pairs + 1); }
};

#if defined(__x86_64__)

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

/// n <= 16 values from p (the rest 0) as bf16 bits: bf16 copied, f32 rounded.
template <typename T>
__m256i bf16x16(const T* p, __mmask16 mask) {
  if constexpr (sizeof(T) == 2) {
    return _mm256_maskz_loadu_epi16(mask, p);
  } else {
    return _mm512_maskz_cvtepi32_epi16(0xffff, ops::bf16_round16(_mm512_maskz_loadu_ps(mask, p)));
  }
}

/// Column tiles c0 .. c1 - 1 of a factor whose pairs run across its rows (sc == 1), slot words
/// apart from out on: two runs of 16 columns interleaved, a pair of rows at a time across all the
/// tiles (each row read once, in order), the rows kAheadPairs pairs ahead asked for.
template <typename T>
void pack_across_rows(const Plan& pl, const T* x, int64_t c0, int64_t c1, int64_t slot,
                      uint32_t* out) {
  const int64_t n_last = pl.cols - (c1 - 1) * kLanes;
  const auto last = static_cast<__mmask16>(n_last >= kLanes ? 0xffff : (1u << n_last) - 1);
  const int64_t bytes = std::min(c1 * kLanes, pl.cols) * static_cast<int64_t>(sizeof(T)) -
                        c0 * kLanes * static_cast<int64_t>(sizeof(T));
  for (int64_t q = 0; q < pl.pairs; ++q) {
    if (const int64_t r = 2 * (q + kAheadPairs); r + 1 < 2 * pl.pairs)
      for (int64_t i = 0; i < 2; ++i) {
        const char* row = reinterpret_cast<const char*>(x + (r + i) * pl.sk + c0 * kLanes);
        for (int64_t byte = 0; byte < bytes; byte += 64) _mm_prefetch(row + byte, _MM_HINT_T0);
      }
    const T* lo = x + 2 * q * pl.sk;
    const T* hi = lo + pl.sk;
    for (int64_t ct = c0; ct < c1; ++ct) {
      const __mmask16 mask = ct + 1 < c1 ? __mmask16{0xffff} : last;
      _mm512_storeu_si512(
          out + (ct - c0) * slot + q * kLanes,
          dot_bf16::interleave(bf16x16(lo + ct * kLanes, mask), bf16x16(hi + ct * kLanes, mask)));
    }
  }
}

/// Column tile ct of the pack, [pairs][16] words: word (q, j) = (X(2q, c), X(2q + 1, c)),
/// c = 16 ct + j, zero past the columns.
template <typename T>
void pack_tile(const Plan& pl, const T* x, int64_t ct, uint32_t* out) {
  const int64_t c0 = ct * kLanes, n = std::min(kLanes, pl.cols - c0);
  const auto mask = static_cast<__mmask16>((1u << n) - 1);
  if (pl.sc == 1) return pack_across_rows(pl, x, ct, ct + 1, 0, out);
  if constexpr (sizeof(T) == 2) {
    if (pl.sk == 1 && pl.sc % 2 == 0) {  // pairs along rows: one 32-bit word each, gathered
      const __m512i rows = _mm512_maskz_mullo_epi32(
          0xffff, _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
          _mm512_set1_epi32(static_cast<int>(pl.sc)));
      const T* base = x + c0 * pl.sc;
      for (int64_t q = 0; q < pl.pairs; ++q)
        _mm512_storeu_si512(
            out + q * kLanes,
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, rows, base + 2 * q, 2));
      return;
    }
  }
  for (int64_t q = 0; q < pl.pairs; ++q)
    for (int64_t j = 0; j < kLanes; ++j) {
      const int64_t c = c0 + j;
      out[q * kLanes + j] =
          c < pl.cols ? dot_bf16::pair(dot_bf16::to_bf16(x[2 * q * pl.sk + c * pl.sc]),
                                       dot_bf16::to_bf16(x[(2 * q + 1) * pl.sk + c * pl.sc]))
                      : 0u;
    }
}

/// Stage [16][16] (+ bias, ReLU) into y: tile (rt, ct) of C, which is y or y^T.
void store_tile(const Plan& pl, const float* stage, int64_t rt, int64_t ct, const float* bias,
                bool relu, float* y, int64_t N) {
  const int64_t r0 = rt * amx::kRows, c0 = ct * kLanes, n = std::min(kLanes, pl.cols - c0);
  if (!pl.transposed) {  // rows of y: 16 columns each
    const auto mask = static_cast<__mmask16>((1u << n) - 1);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + c0) : _mm512_setzero_ps();
    for (int64_t i = 0; i < amx::kRows; ++i) {
      __m512 v = _mm512_add_ps(_mm512_loadu_ps(stage + i * kLanes), b);
      if (relu) v = _mm512_maskz_max_ps(0xffff, v, _mm512_setzero_ps());
      _mm512_mask_storeu_ps(y + (r0 + i) * N + c0, mask, v);
    }
    return;
  }
  // C^T: stage row i is y's column r0 + i, lanes j its rows c0 + j.
  for (int64_t i = 0; i < amx::kRows; ++i) {
    const float b = bias != nullptr ? bias[r0 + i] : 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      const float v = stage[i * kLanes + j] + b;
      y[(c0 + j) * N + r0 + i] = relu ? std::max(v, 0.0f) : v;
    }
  }
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

/// Tiles (rt .. rt + MT - 1) x (ct .. ct + NT - 1) of C into stage [4][16][16]: sums in tiles 0-3
/// (C[i][j] in 2 i + j), A in 4-5 (rows lda halves apart), B in 6-7 (column tile ct's pack at b0,
/// the next b_step words on).
template <int MT, int NT>
void group(const uint16_t* a, int64_t lda, const uint32_t* b0, int64_t b_step, int64_t pairs,
           int64_t rt, float* stage) {
  const uint16_t* a0 = a + rt * amx::kRows * lda;
  const uint16_t* a1 = a0 + amx::kRows * lda;
  const uint32_t* b1 = b0 + b_step;
  _tile_zero(0);
  if constexpr (NT > 1) _tile_zero(1);
  if constexpr (MT > 1) _tile_zero(2);
  if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  for (int64_t q = 0; q < pairs; q += amx::kRows) {
    _tile_loadd(6, b0 + q * kLanes, amx::kRowBytes);
    if constexpr (NT > 1) _tile_loadd(7, b1 + q * kLanes, amx::kRowBytes);
    _tile_loadd(4, a0 + 2 * q, lda * 2);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT > 1) {
      _tile_loadd(5, a1 + 2 * q, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t kTile = amx::kRows * kLanes, kRow = kLanes * 4;
  _tile_stored(0, stage, kRow);
  if constexpr (NT > 1) _tile_stored(1, stage + kTile, kRow);
  if constexpr (MT > 1) _tile_stored(2, stage + 2 * kTile, kRow);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, stage + 3 * kTile, kRow);
}

#pragma GCC pop_options

#endif  // __x86_64__

}  // namespace

std::string gemm_amx_refusal(const AmxGemmShape& s) {
  if (std::string why = amx_bf16_unavailable(); !why.empty()) return why;
  if (s.K % amx::kDepth != 0)
    return fmt::format("takes sums of a multiple of 32 terms only, not {}", s.K);
  if (!a_in_place(s) && !b_in_place(s))
    return "needs the larger factor, or one of at most 64 rows, stored as bf16 with its rows along "
           "the sum, a multiple of 16 of them (b transposed, or a not)";
  return "";
}

int64_t gemm_amx_pack_floats(const AmxGemmShape& s) { return Plan(s).pack_words(); }

void gemm_amx(const AmxGemmShape& s, const void* a, const void* b, const float* bias, bool relu,
              float* y, float* pack) {
#if defined(__x86_64__)
  const Plan pl(s);
  auto* packed = reinterpret_cast<uint32_t*>(pack);
  const auto* in_place = static_cast<const uint16_t*>(pl.transposed ? b : a);
  const void* other = pl.transposed ? a : b;
  const bool other_bf16 = pl.transposed ? s.a_bf16 : s.b_bf16;
  const int64_t col_tiles = pl.cols16 / kLanes, row_tiles = pl.rows / amx::kRows;
  const int64_t tile_words = kLanes * pl.pairs;
  auto pack_into = [&](int64_t ct, uint32_t* out) {
    dot_bf16::with_stored(other, other_bf16, [&](const auto* x) { pack_tile(pl, x, ct, out); });
  };
  // The 2 x 2 tiles of C from row tile rt and column tile ct on, B's tiles packed at b, b_step
  // words apart.
  auto tiles = [&](int64_t rt, int64_t ct, const uint32_t* b, int64_t b_step, float* stage) {
    const bool two_m = rt + 1 < row_tiles, two_n = ct + 1 < col_tiles;
    if (two_m && two_n) {
      group<2, 2>(in_place, s.K, b, b_step, pl.pairs, rt, stage);
    } else if (two_m) {
      group<2, 1>(in_place, s.K, b, b_step, pl.pairs, rt, stage);
    } else if (two_n) {
      group<1, 2>(in_place, s.K, b, b_step, pl.pairs, rt, stage);
    } else {
      group<1, 1>(in_place, s.K, b, b_step, pl.pairs, rt, stage);
    }
    for (int64_t m = 0; m < (two_m ? 2 : 1); ++m)
      for (int64_t t = 0; t < (two_n ? 2 : 1); ++t)
        store_tile(pl, stage + (2 * m + t) * amx::kRows * kLanes, rt + m, ct + t, bias, relu, y,
                   s.N);
  };
  if (pl.rows <= kPackedInLoopRows) {
    // Each thread packs strips of column tiles of at most kStripBytes into its first strip's
    // place, then runs the strip's rows. A factor packed across its rows (sc == 1: the weight of
    // a data gradient) is read a pair of rows at a time across the strip; the strip's tiles lie
    // a line more than a tile apart, so that its rows' stores do not meet in one set of L1.
    const int64_t strip = std::max<int64_t>(2, kStripBytes / (4 * tile_words) / 2 * 2);
    const int64_t strips = (col_tiles + strip - 1) / strip, slot = tile_words + kLanes;
    parallel_for(strips, strip * pl.pairs * kLanes * (4 + 2 * pl.rows),
                 [&](int64_t s0, int64_t s1) {
                   alignas(64) float stage[4 * amx::kRows * kLanes];
                   uint32_t* b = packed + s0 * strip * slot;
                   amx::configure();
                   for (int64_t si = s0; si < s1; ++si) {
                     const int64_t c0 = si * strip, c1 = std::min(col_tiles, c0 + strip);
                     dot_bf16::with_stored(other, other_bf16, [&](const auto* x) {
                       if (pl.sc == 1) return pack_across_rows(pl, x, c0, c1, slot, b);
                       for (int64_t ct = c0; ct < c1; ++ct)
                         pack_tile(pl, x, ct, b + (ct - c0) * slot);
                     });
                     for (int64_t ct = c0; ct < c1; ct += 2)
                       for (int64_t rt = 0; rt < row_tiles; rt += 2)
                         tiles(rt, ct, b + (ct - c0) * slot, slot, stage);
                   }
                 });
    return;
  }
  parallel_for(col_tiles, pl.pairs * kLanes * 4, [&](int64_t t0, int64_t t1) {
    for (int64_t ct = t0; ct < t1; ++ct) pack_into(ct, packed + ct * tile_words);
  });
  // Groups of 2 x 2 tiles of C, row pairs outer.
  const int64_t row_groups = (row_tiles + 1) / 2, col_groups = (col_tiles + 1) / 2;
  parallel_for(row_groups * col_groups, 4 * pl.pairs * 512, [&](int64_t g0, int64_t g1) {
    alignas(64) float stage[4 * amx::kRows * kLanes];
    amx::configure();
    for (int64_t gi = g0; gi < g1; ++gi) {
      const int64_t rt = gi / col_groups * 2, ct = gi % col_groups * 2;
      tiles(rt, ct, packed + ct * tile_words, tile_words, stage);
    }
  });
#else
  (void)s, (void)a, (void)b, (void)bias, (void)relu, (void)y, (void)pack;
#endif
}

}  // namespace minidl::native
