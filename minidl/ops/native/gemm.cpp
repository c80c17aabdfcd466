// Native SGEMM in the BLIS/GotoBLAS layout: cache-blocked loops around packed panels and a
// register-blocked micro-kernel per ISA (AVX-512, AVX2+FMA, portable C++), picked at run time.
//
// Loop nest for one thread's block of C:
//   jc: NC columns of C      bounds the packed B block (kc x nc) so that it stays in L2
//   pc: KC of the K axis     one pass over C per kc block; beta on the first, epilogue on the last
//   ic: MC rows of C         op(A)[ic:ic+mc, pc:pc+kc] packed into MR-row panels (L2)
//   jr, ir: micro-tiles      MR x NR accumulators in registers, one FMA per (row, vector) per k,
//                            A broadcast from its panel, B loaded as vectors from its panel
// With one A block (the usual M <= MC, e.g. batch 64) jr is outside ir: each B panel is packed
// right before its first use and stays in L1 while the A panels stream from L2. With several A
// blocks the B block is reused from L2 anyway, so ir goes outside and the A panel stays in L1.
//
// Both packers write "k outer, panel width inner", so the micro-kernel reads one layout whatever
// the transposes are. Zero padding lets edge tiles run the full-width loop; only the C store is
// masked, and narrow edges pick a kernel instance with fewer rows or vectors.
#include "minidl/ops/native/gemm.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <new>
#include <string_view>
#include <utility>

#include "minidl/core/error.hpp"

namespace minidl::native {
namespace {

using std::int64_t;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// Splits n into equal blocks of at most max_block, each a multiple of unit (but the last). Equal
/// blocks avoid a thin tail block that would pay a full pass over C for little work.
int64_t balanced_block(int64_t n, int64_t max_block, int64_t unit) {
  const int64_t blocks = ceil_div(n, max_block);
  return std::min(round_up(ceil_div(n, blocks), unit), round_up(n, unit));
}

/// One micro-kernel call: C[0:mr, 0:nr] (row stride ldc) <- store(sum_k pa[k * MR + i] *
/// pb[k * ldpb + j]). B rows are ldpb apart: a packed panel has ldpb = its width, the rows of an
/// untransposed B read in place have ldpb = ldb. When pb_out is set the kernel also stores the B
/// rows it reads there, packed NR wide: the first tile of a column panel packs it for the others
/// while its strided loads overlap the FMAs, instead of a separate copy that would stall on them.
struct Tile {
  int64_t kc;
  const float* pa;
  const float* pb;
  int64_t ldpb;
  float* pb_out;
  float* c;
  int64_t ldc;
  int mr;
  int nr;
  bool prefetch_b;  // B is not in L1: read from its source, or streamed from the L2 block
};

/// How a finished tile is written back: C = relu?(alpha * acc + beta * C + bias), or, with an
/// update, the momentum step of GemmMomentum on C (the parameter) and v (its velocity).
struct TileStore {
  float alpha;
  float beta;         // 0 means C is not read
  const float* bias;  // first column of this tile, or nullptr
  bool relu;
  const GemmMomentum* update = nullptr;
  float* v = nullptr;  // the velocity at the tile's first element (row stride ldc)
};

using MicroKernel = void (*)(const Tile& t, const TileStore& st);

/// Packs one panel: element (i, k) for i < w goes to dst[k * W + i], zeros fill i in [w, W).
/// Element (i, k) is src[k * ld + i] when i_contig, else src[i * ld + k]; that covers A (i = row
/// of C) and B (i = column of C) under either transpose.
using PackFn = void (*)(const float* src, int64_t ld, bool i_contig, int64_t w, int64_t kc,
                        int64_t W, float* dst);

constexpr int kMaxMr = 8;  // bounds of the micro-kernel table below
constexpr int kMaxNv = 3;
using MicroTable = std::array<std::array<MicroKernel, kMaxNv>, kMaxMr>;

struct Kernels {
  const char* name;
  int mr;      // rows of the A panel (and of the largest tile)
  int vl;      // floats per vector; B panels are padded to a multiple of it
  int nv;      // vectors per tile row: NR = nv * vl
  int64_t mc;  // upper bounds of the cache blocks; the driver balances them per problem
  int64_t kc;
  int64_t nc;
  MicroTable micro;  // [rows - 1][vectors - 1]: edge tiles run an instance that skips padding
  PackFn pack_a;     // W = mr
  PackFn pack_b;     // W = a multiple of vl
  int nr() const { return vl * nv; }
};

// How many k steps ahead the AVX-512 kernel prefetches a B not in L1: 24 steps are ~300 cycles of
// FMAs, enough to cover an L3 hit.
constexpr int64_t kPrefetchRows = 24;

// ---------------------------------------------------------------------------------------------
// Portable fallback: plain loops that the compiler vectorises for the baseline ISA.

void pack_generic(const float* src, int64_t ld, bool i_contig, int64_t w, int64_t kc, int64_t W,
                  float* dst) {
  for (int64_t k = 0; k < kc; ++k, dst += W) {
    if (i_contig) {
      const float* s = src + k * ld;
      for (int64_t i = 0; i < w; ++i) dst[i] = s[i];
    } else {
      const float* s = src + k;
      for (int64_t i = 0; i < w; ++i) dst[i] = s[i * ld];
    }
    for (int64_t i = w; i < W; ++i) dst[i] = 0.0f;
  }
}

float apply_store(float acc, float c, const TileStore& st, int64_t j) {
  float x = st.alpha * acc;
  if (st.beta != 0.0f) x += st.beta * c;
  if (st.bias != nullptr) x += st.bias[j];
  // (x > 0 ? x : 0), not std::max: NaN maps to 0, as the masked compare in the SIMD paths does.
  if (st.relu) x = x > 0.0f ? x : 0.0f;
  return x;
}

template <int MR, int NR>
void kernel_generic(const Tile& t, const TileStore& st) {
  float acc[MR][NR] = {};
  const float* pa = t.pa;
  const float* pb = t.pb;
  for (int64_t k = 0; k < t.kc; ++k, pa += MR, pb += t.ldpb) {
    if (t.pb_out != nullptr) std::copy(pb, pb + NR, t.pb_out + k * NR);
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) acc[i][j] += pa[i] * pb[j];
    }
  }
  for (int i = 0; i < t.mr; ++i) {
    float* row = t.c + i * t.ldc;
    for (int j = 0; j < t.nr; ++j) row[j] = apply_store(acc[i][j], row[j], st, j);
  }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA. Packing needs only AVX2, so the AVX-512 set reuses this packer.

#define MINIDL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define MINIDL_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))

/// Lane masks for maskload/maskstore: kLaneMask + 8 - n enables the first n of 8 lanes.
alignas(64) constexpr int kLaneMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

MINIDL_TARGET_AVX2 inline __m256i lane_mask(int64_t n) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneMask + 8 - n));
}

/// Rows r and r + 4 of a block, columns [0, 4) each, as the low and high 128-bit lanes.
MINIDL_TARGET_AVX2 inline __m256 load_rows_r_r4(const float* src, int64_t ld) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(src)), _mm_loadu_ps(src + 4 * ld),
                              1);
}

/// dst[k * dst_ld + r] = src[r * ld + k] for an 8 x 8 block. Loading 128-bit halves straight into
/// the two lanes does the cross-lane step with loads, leaving 16 in-lane shuffles.
MINIDL_TARGET_AVX2 inline void transpose_8x8(const float* src, int64_t ld, float* dst,
                                             int64_t dst_ld) {
  for (int col = 0; col < 8; col += 4) {
    // Lane 0 holds rows 0-3, lane 1 rows 4-7, columns col..col+3; a 4x4 transpose per lane.
    const float* s = src + col;
    const __m256 t0 = load_rows_r_r4(s, ld), t1 = load_rows_r_r4(s + ld, ld);
    const __m256 t2 = load_rows_r_r4(s + 2 * ld, ld), t3 = load_rows_r_r4(s + 3 * ld, ld);
    const __m256 u0 = _mm256_unpacklo_ps(t0, t1), u1 = _mm256_unpackhi_ps(t0, t1);
    const __m256 u2 = _mm256_unpacklo_ps(t2, t3), u3 = _mm256_unpackhi_ps(t2, t3);
    _mm256_storeu_ps(dst + (col + 0) * dst_ld, _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm256_storeu_ps(dst + (col + 1) * dst_ld, _mm256_shuffle_ps(u0, u2, _MM_SHUFFLE(3, 2, 3, 2)));
    _mm256_storeu_ps(dst + (col + 2) * dst_ld, _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm256_storeu_ps(dst + (col + 3) * dst_ld, _mm256_shuffle_ps(u1, u3, _MM_SHUFFLE(3, 2, 3, 2)));
  }
}

/// transpose_8x8 of the last, partial block of rows: rows [rows, 8) read as zeros.
MINIDL_TARGET_AVX2 inline void transpose_rows_8x8(const float* src, int64_t ld, int64_t rows,
                                                  float* dst, int64_t dst_ld) {
  alignas(32) float block[8][8] = {};
  for (int64_t r = 0; r < rows; ++r) _mm256_store_ps(block[r], _mm256_loadu_ps(src + r * ld));
  transpose_8x8(&block[0][0], 8, dst, dst_ld);
}

/// The common full-width copy: NV8 vectors per k, no masks or zero fill.
template <int NV8>
MINIDL_TARGET_AVX2 void copy_panel(const float* src, int64_t ld, int64_t kc, float* dst) {
  for (int64_t k = 0; k < kc; ++k, src += ld, dst += 8 * NV8) {
#pragma GCC unroll 8
    for (int v = 0; v < NV8; ++v) _mm256_storeu_ps(dst + 8 * v, _mm256_loadu_ps(src + 8 * v));
  }
}

/// PackFn for W a multiple of 8.
MINIDL_TARGET_AVX2 void pack_avx2(const float* src, int64_t ld, bool i_contig, int64_t w,
                                  int64_t kc, int64_t W, float* dst) {
  const int64_t w8 = w / 8 * 8;
  const int64_t w_up = round_up(w, 8);
  if (i_contig) {
    if (w == W) {
      switch (W) {
        case 8:
          return copy_panel<1>(src, ld, kc, dst);
        case 16:
          return copy_panel<2>(src, ld, kc, dst);
        case 32:
          return copy_panel<4>(src, ld, kc, dst);
        case 48:
          return copy_panel<6>(src, ld, kc, dst);
        default:
          break;
      }
    }
    const __m256i tail = lane_mask(w - w8);
    for (int64_t k = 0; k < kc; ++k) {
      const float* s = src + k * ld;
      float* d = dst + k * W;
      int64_t i = 0;
      for (; i < w8; i += 8) _mm256_storeu_ps(d + i, _mm256_loadu_ps(s + i));
      // maskload reads only the w - w8 valid floats and zeroes the rest of the vector.
      if (i < w) _mm256_storeu_ps(d + i, _mm256_maskload_ps(s + i, tail));
      for (i = w_up; i < W; i += 8) _mm256_storeu_ps(d + i, _mm256_setzero_ps());
    }
    return;
  }
  // Each of the w source rows is contiguous along k: transpose 8 x 8 blocks (the last one padded
  // with zero rows), then the k tail element by element.
  const int64_t k8 = kc / 8 * 8;
  for (int64_t i = 0; i < w_up; i += 8) {
    const int64_t rows = std::min<int64_t>(8, w - i);
    const float* s = src + i * ld;
    for (int64_t k = 0; k < k8; k += 8) {
      if (rows == 8) {
        transpose_8x8(s + k, ld, dst + k * W + i, W);
      } else {
        transpose_rows_8x8(s + k, ld, rows, dst + k * W + i, W);
      }
    }
    for (int64_t k = k8; k < kc; ++k) {
      for (int64_t r = 0; r < 8; ++r) dst[k * W + i + r] = r < rows ? s[r * ld + k] : 0.0f;
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    for (int64_t i = w_up; i < W; i += 8) _mm256_storeu_ps(dst + k * W + i, _mm256_setzero_ps());
  }
}

template <int MR, int ROWS, int NV>
MINIDL_TARGET_AVX2 void kernel_avx2(const Tile& t, const TileStore& st) {
  __m256 acc[ROWS][NV];
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  }
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(t.c + i * t.ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(t.c + i * t.ldc + 8 * NV - 1), _MM_HINT_T0);
  }
  const float* pa = t.pa;
  const float* pb = t.pb;
  float* pb_out = t.pb_out;
  for (int64_t k = 0; k < t.kc; ++k, pa += MR, pb += t.ldpb) {
    __m256 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(pb + 8 * v);
    if (pb_out != nullptr) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(pb_out + 8 * v, b[v]);
      pb_out += 8 * NV;
    }
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
      const __m256 a = _mm256_broadcast_ss(pa + i);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }

  __m256i mask[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) mask[v] = lane_mask(std::clamp(t.nr - 8 * v, 0, 8));
  if (st.alpha == 1.0f && st.beta == 0.0f && st.bias == nullptr && !st.relu) {
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm256_maskstore_ps(t.c + i * t.ldc + 8 * v, mask[v], acc[i][v]);
    }
    return;
  }
  const __m256 alpha = _mm256_set1_ps(st.alpha);
  const __m256 beta = _mm256_set1_ps(st.beta);
  const __m256 zero = _mm256_setzero_ps();
  __m256 bias[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    bias[v] = st.bias != nullptr ? _mm256_maskload_ps(st.bias + 8 * v, mask[v]) : zero;
  }
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
    float* row = t.c + i * t.ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m256 x = _mm256_mul_ps(acc[i][v], alpha);
      if (st.beta != 0.0f) x = _mm256_fmadd_ps(_mm256_maskload_ps(row + 8 * v, mask[v]), beta, x);
      if (st.bias != nullptr) x = _mm256_add_ps(x, bias[v]);
      if (st.relu) x = _mm256_and_ps(x, _mm256_cmp_ps(x, zero, _CMP_GT_OQ));
      _mm256_maskstore_ps(row + 8 * v, mask[v], x);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AVX-512.

/// The k loop: acc += A panel x B rows, plus the optional B copy and prefetches (see Tile).
template <int MR, int ROWS, int NV, bool kCopyB, bool kPrefetchB>
MINIDL_TARGET_AVX512 __attribute__((always_inline)) inline void k_loop_avx512(
    __m512 (&acc)[ROWS][NV], const Tile& t) {
  const float* pa = t.pa;
  const float* pb = t.pb;
  float* pb_out = t.pb_out;
  for (int64_t k = 0; k < t.kc; ++k, pa += MR, pb += t.ldpb) {
    // A panels usually stream from L2; a line holds two steps, 16 steps ahead hides the latency.
    if ((k & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(pa + 16 * MR), _MM_HINT_T0);
    if constexpr (kPrefetchB) {
      // Every line of the row kPrefetchRows ahead, whatever the alignment of a strided source.
      const float* ahead = pb + kPrefetchRows * t.ldpb;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 16 * v), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(ahead + 16 * NV - 1), _MM_HINT_T0);
    }
    __m512 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(pb + 16 * v);
    if constexpr (kCopyB) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_store_ps(pb_out + 16 * v, b[v]);
      pb_out += 16 * NV;
    }
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
      const __m512 a = _mm512_set1_ps(pa[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
}

template <int MR, int ROWS, int NV>
MINIDL_TARGET_AVX512 void kernel_avx512(const Tile& t, const TileStore& st) {
  __m512 acc[ROWS][NV];
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  // C is read only after the k loop, but its lines are likely in L2 or L3: start them now.
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(t.c + i * t.ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(t.c + i * t.ldc + 16 * NV - 1), _MM_HINT_T0);
  }
  if (st.update != nullptr) {
    // The update reads every line of its parameter and velocity rows: start the rest too (rows
    // of a weight lie pages apart, where the hardware prefetchers do not follow).
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
#pragma GCC unroll 4
      for (int v = 0; v <= NV; ++v) {
        const int64_t at = i * t.ldc + std::min(16 * v, 16 * NV - 1);
        _mm_prefetch(reinterpret_cast<const char*>(t.c + at), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(st.v + at), _MM_HINT_T0);
      }
    }
  }
  if (t.pb_out != nullptr) {
    k_loop_avx512<MR, ROWS, NV, true, true>(acc, t);
  } else if (t.prefetch_b) {
    k_loop_avx512<MR, ROWS, NV, false, true>(acc, t);
  } else {
    k_loop_avx512<MR, ROWS, NV, false, false>(acc, t);
  }

  __mmask16 mask[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    mask[v] = static_cast<__mmask16>((1u << std::clamp(t.nr - 16 * v, 0, 16)) - 1u);
  }
  if (st.update != nullptr) {
    const GemmMomentum& u = *st.update;
    const __m512 alpha = _mm512_set1_ps(st.alpha);
    const __m512 lr = _mm512_set1_ps(u.lr);
    const __m512 mu = _mm512_set1_ps(u.momentum);
    const __m512 wd = _mm512_set1_ps(u.weight_decay);
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
      float* prow = t.c + i * t.ldc;
      float* vrow = st.v + i * t.ldc;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        __m512 p = _mm512_maskz_loadu_ps(mask[v], prow + 16 * v);
        const __m512 d = _mm512_fmadd_ps(wd, p, _mm512_mul_ps(acc[i][v], alpha));
        const __m512 vel = _mm512_fmadd_ps(mu, _mm512_maskz_loadu_ps(mask[v], vrow + 16 * v), d);
        p = _mm512_fnmadd_ps(lr, u.nesterov ? _mm512_fmadd_ps(mu, vel, d) : vel, p);
        _mm512_mask_storeu_ps(vrow + 16 * v, mask[v], vel);
        _mm512_mask_storeu_ps(prow + 16 * v, mask[v], p);
      }
    }
    return;
  }
  if (st.alpha == 1.0f && st.beta == 0.0f && st.bias == nullptr && !st.relu) {
    // The plain C = A * B store; it matters when a short K leaves the store a large share.
#pragma GCC unroll 16
    for (int i = 0; i < ROWS; ++i) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        _mm512_mask_storeu_ps(t.c + i * t.ldc + 16 * v, mask[v], acc[i][v]);
    }
    return;
  }
  const __m512 alpha = _mm512_set1_ps(st.alpha);
  const __m512 beta = _mm512_set1_ps(st.beta);
  const __m512 zero = _mm512_setzero_ps();
  __m512 bias[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    bias[v] = st.bias != nullptr ? _mm512_maskz_loadu_ps(mask[v], st.bias + 16 * v) : zero;
  }
#pragma GCC unroll 16
  for (int i = 0; i < ROWS; ++i) {
    float* row = t.c + i * t.ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 x = _mm512_mul_ps(acc[i][v], alpha);
      if (st.beta != 0.0f) {
        x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask[v], row + 16 * v), beta, x);
      }
      if (st.bias != nullptr) x = _mm512_add_ps(x, bias[v]);
      // maskz_mov on (x > 0) rather than max_ps, whose GCC 12 header trips -Wmaybe-uninitialized.
      if (st.relu) x = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), x);
      _mm512_mask_storeu_ps(row + 16 * v, mask[v], x);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel sets. Blocking targets a recent Xeon (48 KiB L1d, 2 MiB L2 per core): a kc x NR B panel
// (192 x 48 floats = 36 KiB) fits L1 next to an 8 x 192 A panel, the mc x kc A block (192 KiB)
// and the kc x nc B block (at most ~1.5 MiB) fit L2. Measured flat within a few percent for
// kc in 128..256 and mc in 128..512.

template <int MR, int R>
constexpr std::array<MicroKernel, kMaxNv> avx512_row() {
  return {&kernel_avx512<MR, R, 1>, &kernel_avx512<MR, R, 2>, &kernel_avx512<MR, R, 3>};
}
template <int MR, int R>
constexpr std::array<MicroKernel, kMaxNv> avx2_row() {
  return {&kernel_avx2<MR, R, 1>, &kernel_avx2<MR, R, 2>, nullptr};
}
constexpr std::array<MicroKernel, kMaxNv> kGenericRow = {&kernel_generic<4, 16>, nullptr, nullptr};

// 8 x 48: 24 zmm accumulators, 3 vector loads and 8 broadcasts per 24 FMAs. It beat 8x32 by ~5%
// (up to 10% on 1024^2 products), and 12x32 / 14x32 by more on these shapes; MR = 8 divides the
// batch of 64 and keeps the A transposes in 8 x 8 blocks.
constexpr Kernels kAvx512 = {
    .name = "avx512",
    .mr = 8,
    .vl = 16,
    .nv = 3,
    .mc = 256,
    .kc = 192,
    .nc = 2040,
    .micro = {avx512_row<8, 1>(), avx512_row<8, 2>(), avx512_row<8, 3>(), avx512_row<8, 4>(),
              avx512_row<8, 5>(), avx512_row<8, 6>(), avx512_row<8, 7>(), avx512_row<8, 8>()},
    .pack_a = pack_avx2,
    .pack_b = pack_avx2};
// 6 x 16: 12 of the 16 ymm registers accumulate, the classic Haswell shape. MR = 6 is not a
// multiple of 8, so A takes the portable packer.
constexpr Kernels kAvx2 = {.name = "avx2",
                           .mr = 6,
                           .vl = 8,
                           .nv = 2,
                           .mc = 192,
                           .kc = 256,
                           .nc = 2048,
                           .micro = {avx2_row<6, 1>(), avx2_row<6, 2>(), avx2_row<6, 3>(),
                                     avx2_row<6, 4>(), avx2_row<6, 5>(), avx2_row<6, 6>()},
                           .pack_a = pack_generic,
                           .pack_b = pack_avx2};
constexpr Kernels kGeneric = {.name = "generic",
                              .mr = 4,
                              .vl = 16,
                              .nv = 1,
                              .mc = 128,
                              .kc = 256,
                              .nc = 1024,
                              .micro = {kGenericRow, kGenericRow, kGenericRow, kGenericRow},
                              .pack_a = pack_generic,
                              .pack_b = pack_generic};

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
         __builtin_cpu_supports("fma");
}
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

const Kernels* kernels_by_name(std::string_view name) {
  if (name == "avx512") {
    MINIDL_CHECK(cpu_has_avx512(), "gemm isa 'avx512' requested but this CPU lacks avx512f");
    return &kAvx512;
  }
  if (name == "avx2") {
    MINIDL_CHECK(cpu_has_avx2(), "gemm isa 'avx2' requested but this CPU lacks avx2/fma");
    return &kAvx2;
  }
  if (name == "generic") return &kGeneric;
  MINIDL_FAIL("unknown gemm isa '", name, "'; expected avx512, avx2 or generic");
}

const Kernels& detected_kernels() {
  // Decided once: MINIDL_GEMM_ISA if set, else the widest ISA the CPU (and OS) supports.
  static const Kernels* const chosen = [] {
    if (const char* env = std::getenv("MINIDL_GEMM_ISA"); env != nullptr && *env != '\0') {
      return kernels_by_name(env);
    }
    if (cpu_has_avx512()) return &kAvx512;
    if (cpu_has_avx2()) return &kAvx2;
    return &kGeneric;
  }();
  return *chosen;
}

std::atomic<const Kernels*> g_forced{nullptr};

const Kernels& active_kernels() {
  const Kernels* forced = g_forced.load(std::memory_order_relaxed);
  return forced != nullptr ? *forced : detected_kernels();
}

// ---------------------------------------------------------------------------------------------
// Driver.

/// A per-thread 64-byte aligned scratch buffer that only grows, so steady-state calls allocate
/// nothing. thread_local keeps concurrent callers and OpenMP workers apart.
class PackBuffer {
 public:
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data_); }

  float* get(int64_t floats) {
    const auto bytes = static_cast<std::size_t>(round_up(std::max<int64_t>(floats, 16) * 4, 64));
    if (bytes > capacity_) {
      std::free(data_);
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      capacity_ = data_ != nullptr ? bytes : 0;
      if (data_ == nullptr) throw std::bad_alloc();
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  std::size_t capacity_ = 0;
};

struct GemmArgs {
  bool trans_a;
  bool trans_b;
  int64_t M, N, K;
  float alpha;
  const float* A;
  int64_t lda;
  const float* B;
  int64_t ldb;
  float beta;
  float* C;
  int64_t ldc;
  const float* bias;
  bool relu;
  const GemmMomentum* update = nullptr;  // set: one pass over K (K <= kc), AVX-512 tiles only
};

// A thread's share of C (with a fused update, of the parameter and velocity) larger than this
// does not stay in the second-level cache (2 MiB per core on the Xeons measured) from one step to
// the next. The CIFAR CNN's fc1 weight gradient with its update (256 x 4096 x 32, 4 MiB per
// thread) took 695-706 us per training step with its tiles along the rows against 900-1043 down
// the columns (Intel Xeon with AMX, --profile, three alternating runs); the MLP's (256 x 784 x
// 64, 784 KiB per thread) stays in cache and ran faster down the columns (B's panel in L1). On
// an AMD EPYC the rows had won only while the machine was slow (docs/performance.md).
constexpr int64_t kStreamedStoreBytes = int64_t{1} << 20;

/// C[i0:i0+m, j0:j0+n] of the full product, on the calling thread.
void gemm_block(const Kernels& kn, const GemmArgs& g, int64_t i0, int64_t m, int64_t j0,
                int64_t n) {
  thread_local PackBuffer a_buffer;
  thread_local PackBuffer b_buffer;
  const int64_t mr = kn.mr, nr = kn.nr(), vl = kn.vl;
  const int64_t kc_max = balanced_block(g.K, kn.kc, 1);
  const int64_t mc_max = balanced_block(m, kn.mc, mr);
  const int64_t nc_max = balanced_block(n, kn.nc, nr);
  // One A block: each B panel serves only the tiles of one jr step, so a single L1-sized slot is
  // reused, and the tiles go down C's columns. Several: the whole packed B block is kept (in L2)
  // for the later A blocks, and the tiles go along C's rows. So they do too where one k block
  // makes the product and what its store touches (C, or a fused update's parameter and velocity)
  // outgrows the cache: along the rows, each of a tile's rows is a sequential stream that the
  // hardware prefetchers follow; down the columns each row's 192 bytes lie in another page.
  const int64_t store_bytes =
      m * n * static_cast<int64_t>(sizeof(float)) * (g.update != nullptr ? 2 : 1);
  const bool reuse_b = mc_max < m || (kc_max >= g.K && store_bytes > kStreamedStoreBytes);
  float* a_pack = a_buffer.get(round_up(mc_max, mr) * kc_max);
  float* b_pack = b_buffer.get((reuse_b ? round_up(nc_max, nr) : nr) * kc_max);

  for (int64_t jc = 0; jc < n; jc += nc_max) {
    const int64_t nc = std::min(nc_max, n - jc);
    const int64_t col = j0 + jc;  // column of C and of op(B)
    for (int64_t pc = 0; pc < g.K; pc += kc_max) {
      const int64_t kc = std::min(kc_max, g.K - pc);
      const bool last = pc + kc == g.K;
      // Each tile sets its own fields of this one store (no copy of the struct per tile: GCC
      // copied it in 16-byte pieces just after writing single fields, and the loads waited on
      // the stores; with a 32-deep product that stall was a large share of each tile).
      TileStore store{g.alpha, pc == 0 ? g.beta : 1.0f, nullptr, last && g.relu};
      store.update = g.update;
      // op(B)(k, j) is B[k * ldb + j], or B[j * ldb + k] when trans_b.
      const float* b_src = g.trans_b ? g.B + col * g.ldb + pc : g.B + pc * g.ldb + col;
      for (int64_t ic = 0; ic < m; ic += mc_max) {
        const int64_t mc = std::min(mc_max, m - ic);
        const int64_t row = i0 + ic;
        // op(A)(i, k) is A[i * lda + k], or A[k * lda + i] when trans_a.
        const float* a_src = g.trans_a ? g.A + pc * g.lda + row : g.A + row * g.lda + pc;
        for (int64_t ir = 0; ir < mc; ir += mr) {
          const float* a_panel = g.trans_a ? a_src + ir : a_src + ir * g.lda;
          kn.pack_a(a_panel, g.lda, g.trans_a, std::min(mr, mc - ir), kc, mr, a_pack + ir * kc);
        }

        // B panels are packed on the first A block. A full panel of an untransposed B is packed
        // by its first tile (see Tile); transposed or ragged panels by pack_b, beforehand.
        auto b_panel_src = [&](int64_t jr) { return g.trans_b ? b_src + jr * g.ldb : b_src + jr; };
        auto packs_in_kernel = [&](int64_t jr) { return ic == 0 && !g.trans_b && nc - jr >= nr; };
        auto pack_panel = [&](int64_t jr, float* pb) {
          const int64_t w = std::min(nr, nc - jr);
          if (ic == 0 && !packs_in_kernel(jr)) {
            kn.pack_b(b_panel_src(jr), g.ldb, !g.trans_b, w, kc, round_up(w, vl), pb);
          }
        };
        auto run_tile = [&](int64_t ir, int64_t jr, float* pb) {
          const int64_t nr_cur = std::min(nr, nc - jr);
          const int64_t width = round_up(nr_cur, vl);  // edge panels pad to whole vectors only
          const int rows = static_cast<int>(std::min(mr, mc - ir));
          const bool packs = ir == 0 && packs_in_kernel(jr);
          const Tile tile{kc,
                          a_pack + ir * kc,
                          packs ? b_panel_src(jr) : pb,
                          packs ? g.ldb : width,
                          packs ? pb : nullptr,
                          g.C + (row + ir) * g.ldc + col + jr,
                          g.ldc,
                          rows,
                          static_cast<int>(nr_cur),
                          reuse_b || packs};
          store.bias = last && g.bias != nullptr ? g.bias + col + jr : nullptr;
          if (g.update != nullptr) store.v = g.update->velocity + (row + ir) * g.ldc + col + jr;
          kn.micro[rows - 1][width / vl - 1](tile, store);
        };

        if (reuse_b) {
          // ir outside: the A panel stays in L1 and the B panels stream from the L2 block.
          for (int64_t jr = 0; jr < nc; jr += nr) pack_panel(jr, b_pack + jr * kc);
          for (int64_t ir = 0; ir < mc; ir += mr) {
            for (int64_t jr = 0; jr < nc; jr += nr) run_tile(ir, jr, b_pack + jr * kc);
          }
        } else {
          // jr outside: each B panel is packed right before its tiles and stays in L1.
          for (int64_t jr = 0; jr < nc; jr += nr) {
            pack_panel(jr, b_pack);
            for (int64_t ir = 0; ir < mc; ir += mr) run_tile(ir, jr, b_pack);
          }
        }
      }
    }
  }
}

/// The 16 horizontal sums of v[0..15] as one vector (lane j: the sum of v[j]'s lanes): pairs are
/// interleaved and added, halving the vectors at each of four levels.
// The masked forms with every lane selected: GCC 12's plain forms of these start from an
// undefined vector and trip -Wmaybe-uninitialized.
MINIDL_TARGET_AVX512 inline __m512 unpack_lo(__m512 a, __m512 b) {
  return _mm512_mask_unpacklo_ps(_mm512_setzero_ps(), 0xffff, a, b);
}
MINIDL_TARGET_AVX512 inline __m512 unpack_hi(__m512 a, __m512 b) {
  return _mm512_mask_unpackhi_ps(_mm512_setzero_ps(), 0xffff, a, b);
}
template <int kImm>
MINIDL_TARGET_AVX512 inline __m512 shuffle_in_lanes(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_ps(_mm512_setzero_ps(), 0xffff, a, b, kImm);
}
template <int kImm>
MINIDL_TARGET_AVX512 inline __m512 shuffle_lanes(__m512 a, __m512 b) {
  return _mm512_mask_shuffle_f32x4(_mm512_setzero_ps(), 0xffff, a, b, kImm);
}

MINIDL_TARGET_AVX512 inline __m512 transpose_sum16(const __m512 (&v)[16]) {
  __m512 w[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    // Within each 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d] lane sums.
    const __m512 a = v[4 * g], b = v[4 * g + 1], c = v[4 * g + 2], d = v[4 * g + 3];
    const __m512 ab = _mm512_add_ps(unpack_lo(a, b), unpack_hi(a, b));
    const __m512 cd = _mm512_add_ps(unpack_lo(c, d), unpack_hi(c, d));
    w[g] = _mm512_add_ps(shuffle_in_lanes<_MM_SHUFFLE(1, 0, 1, 0)>(ab, cd),
                         shuffle_in_lanes<_MM_SHUFFLE(3, 2, 3, 2)>(ab, cd));
  }
  // Across the four 128-bit lanes: lane g of the result is the total of w[g]'s lanes.
  const __m512 z01 =
      _mm512_add_ps(shuffle_lanes<0x88>(w[0], w[1]), shuffle_lanes<0xdd>(w[0], w[1]));
  const __m512 z23 =
      _mm512_add_ps(shuffle_lanes<0x88>(w[2], w[3]), shuffle_lanes<0xdd>(w[2], w[3]));
  return _mm512_add_ps(shuffle_lanes<0x88>(z01, z23), shuffle_lanes<0xdd>(z01, z23));
}

/// N dot products of R rows of A (a[r], contiguous along K) with the N rows of B (contiguous along
/// K), 16 k at a time: acc[r][j] holds row r's partial sums with B row j, lane by lane.
template <int N, int R>
MINIDL_TARGET_AVX512 inline void narrow_dots(const GemmArgs& g, const float* const (&a)[R],
                                             __m512 (&acc)[R][16]) {
  const int64_t k16 = g.K / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (g.K - k16)) - 1u);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j)
    for (int r = 0; r < R; ++r) acc[r][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k16; k += 16) {
    __m512 x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm512_loadu_ps(a[r] + k);
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const __m512 b = _mm512_loadu_ps(g.B + j * g.ldb + k);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(x[r], b, acc[r][j]);
    }
  }
  if (tail != 0) {
    __m512 x[R];
    for (int r = 0; r < R; ++r) x[r] = _mm512_maskz_loadu_ps(tail, a[r] + k16);
#pragma GCC unroll 16
    for (int j = 0; j < N; ++j) {
      const __m512 b = _mm512_maskz_loadu_ps(tail, g.B + j * g.ldb + k16);
      for (int r = 0; r < R; ++r) acc[r][j] = _mm512_fmadd_ps(x[r], b, acc[r][j]);
    }
  }
}

/// Row i of C from its N dot products' lane sums: alpha, beta, bias, ReLU, then a masked store.
MINIDL_TARGET_AVX512 inline void narrow_store(const GemmArgs& g, int64_t i, const __m512 (&acc)[16],
                                              __mmask16 mask, __m512 bias) {
  float* c = g.C + i * g.ldc;
  __m512 y = _mm512_mul_ps(transpose_sum16(acc), _mm512_set1_ps(g.alpha));
  if (g.beta != 0.0f)
    y = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, c), _mm512_set1_ps(g.beta), y);
  y = _mm512_add_ps(y, bias);
  if (g.relu) y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), y);
  _mm512_mask_storeu_ps(c, mask, y);
}

/// C rows [i0, i1) of a product at most 16 columns wide whose operands are both contiguous along
/// K (A untransposed, B transposed: a classifier layer, N = classes): per row, N dot products
/// accumulated 16 k at a time and summed across lanes together. Nothing is packed: for such a
/// product the packing would cost more than the arithmetic. With N <= 12 two rows go together,
/// so that each vector of B loaded serves both (B, N x K, is re-read for every row pair and
/// outgrows L1 on a wide layer); each element's sums run in the same order either way.
template <int N>
MINIDL_TARGET_AVX512 void gemm_narrow_avx512(const GemmArgs& g, int64_t i0, int64_t i1) {
  const auto mask = static_cast<__mmask16>((1u << N) - 1u);
  const __m512 bias = g.bias != nullptr ? _mm512_maskz_loadu_ps(mask, g.bias) : _mm512_setzero_ps();
  int64_t i = i0;
  if constexpr (N <= 12) {  // 2N accumulators, 2 rows of A and a row of B in registers
    for (; i + 2 <= i1; i += 2) {
      const float* const a[2] = {g.A + i * g.lda, g.A + (i + 1) * g.lda};
      __m512 acc[2][16];
      narrow_dots<N, 2>(g, a, acc);
      narrow_store(g, i, acc[0], mask, bias);
      narrow_store(g, i + 1, acc[1], mask, bias);
    }
  }
  for (; i < i1; ++i) {
    const float* const a[1] = {g.A + i * g.lda};
    __m512 acc[1][16];
    narrow_dots<N, 1>(g, a, acc);
    narrow_store(g, i, acc[0], mask, bias);
  }
}

using NarrowFn = void (*)(const GemmArgs&, int64_t, int64_t);
template <std::size_t... N>
constexpr std::array<NarrowFn, sizeof...(N)> narrow_table(std::index_sequence<N...>) {
  return {&gemm_narrow_avx512<static_cast<int>(N) + 1>...};
}
constexpr auto kNarrow = narrow_table(std::make_index_sequence<16>());

/// C rows [i0, i1) of an untransposed product with a short inner dimension (K <= 16: the input
/// gradient of a classifier layer, K = classes) and C rows of NV whole vectors: each row is a sum
/// of K broadcast A elements times B rows, read in place (B is small enough to stay in L1).
template <int NV>
MINIDL_TARGET_AVX512 void gemm_short_k_avx512(const GemmArgs& g, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* a = g.A + i * g.lda;
    __m512 acc[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < g.K; ++k) {
      const __m512 x = _mm512_set1_ps(a[k]);
      const float* b = g.B + k * g.ldb;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[v] = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 16 * v), acc[v]);
    }
    float* c = g.C + i * g.ldc;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      __m512 y = _mm512_mul_ps(acc[v], _mm512_set1_ps(g.alpha));
      if (g.beta != 0.0f)
        y = _mm512_fmadd_ps(_mm512_loadu_ps(c + 16 * v), _mm512_set1_ps(g.beta), y);
      if (g.bias != nullptr) y = _mm512_add_ps(y, _mm512_loadu_ps(g.bias + 16 * v));
      if (g.relu)
        y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_GT_OQ), y);
      _mm512_storeu_ps(c + 16 * v, y);
    }
  }
}

template <std::size_t... NV>
constexpr std::array<NarrowFn, sizeof...(NV)> short_k_table(std::index_sequence<NV...>) {
  return {&gemm_short_k_avx512<static_cast<int>(NV) + 1>...};
}
constexpr auto kShortK = short_k_table(std::make_index_sequence<8>());

bool short_k_case(const Kernels& kn, const GemmArgs& g) {
  return &kn == &kAvx512 && !g.trans_a && !g.trans_b && g.K <= 16 && g.N % 16 == 0 && g.N <= 128;
}

bool narrow_case(const Kernels& kn, const GemmArgs& g) {
  return &kn == &kAvx512 && !g.trans_a && g.trans_b && g.N <= 16;
}

/// C = relu?(beta * C + bias) for the cases with no product to add (K == 0 or alpha == 0).
void scale_c(const GemmArgs& g) {
  for (int64_t i = 0; i < g.M; ++i) {
    float* row = g.C + i * g.ldc;
    for (int64_t j = 0; j < g.N; ++j) {
      float x = g.beta != 0.0f ? g.beta * row[j] : 0.0f;
      if (g.bias != nullptr) x += g.bias[j];
      if (g.relu) x = x > 0.0f ? x : 0.0f;
      row[j] = x;
    }
  }
}

/// The thread grid tm x tn over C and the rows/columns per thread (multiples of MR and of the
/// vector width).
struct Partition {
  int tm = 1, tn = 1;
  int64_t rows = 0, cols = 0;
};

// Below this many multiply-adds per thread, waking a second thread costs more than it saves. At
// 2^18 the MNIST CNN's classifier (32 x 1352 x 10, 432 Ki multiply-adds) ran on one thread: its
// weight gradient 7.8 us against oneDNN's 5.4 at two threads (minidl_bench, Intel Xeon with
// AMX); at 2^17 it takes two, 6.1-6.2 against 5.9-6.2, and its forward 7.5-7.9 against 11.3.
constexpr int64_t kMinFmaPerThread = int64_t{1} << 17;
// Packing one element costs about as much as this many multiply-adds in the micro-kernel; it
// prices the packing that each extra thread duplicates (A for a column split, B for a row split).
constexpr int64_t kPackCost = 8;

// Reading one element of C from another core's cache costs about as much as this many
// multiply-adds (measured: the MLP's first-layer weight gradient and its SGD update).
constexpr int64_t kTransferCost = 2;

/// The cheapest tm x tn grid. c_read_next: elementwise kernels read C after the product (a plain
/// product); a fused optimizer update is C's last access in the step, so no transfer is priced.
Partition choose_partition(const Kernels& kn, int64_t M, int64_t N, int64_t K, int threads,
                           bool c_read_next) {
  Partition best;
  best.rows = M;
  best.cols = N;
  int64_t best_cost = -1;
  for (int tm = 1; tm <= threads; ++tm) {
    if (threads % tm != 0) continue;
    const int tn = threads / tm;
    const int64_t rows = round_up(ceil_div(M, tm), kn.mr);
    // Columns go in whole vectors, not whole panels: 256 splits 128 + 128 rather than 144 + 112;
    // the edge panel of each half then runs the narrower kernel instance.
    const int64_t cols = round_up(ceil_div(N, tn), kn.vl);
    // A column split leaves each thread a strided part of C, while the elementwise kernels that
    // read C next (bias, activation gradients, the optimizer update) split it into contiguous
    // ranges: each thread would then read part of its range from the other core's cache. A
    // fused update has no such reader; there the row split only duplicates the packing of B,
    // and it ran bimodally on an AMD EPYC (the CIFAR CNN's fc1 weight gradient, 256 x 4096 x
    // 32, 2 threads: 165 or 365 us per call from one minute to the next, against 160-185 us
    // split by columns; the MLP's first layer 55 or 85 against 55-64 us).
    const int64_t transfer = tn > 1 && c_read_next ? kTransferCost * M * N * (tn - 1) / tn : 0;
    const int64_t cost = rows * cols * K + kPackCost * (rows + cols) * K + transfer;
    if (best_cost < 0 || cost < best_cost) {
      best = {tm, tn, rows, cols};
      best_cost = cost;
    }
  }
  return best;
}

void sgemm_impl(const GemmArgs& g) {
  MINIDL_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, "sgemm: negative size M=", g.M, " N=", g.N,
               " K=", g.K);
  MINIDL_CHECK(g.ldc >= g.N, "sgemm: ldc=", g.ldc, " is less than N=", g.N);
  if (g.M == 0 || g.N == 0) return;
  MINIDL_CHECK(g.C != nullptr, "sgemm: C is null for M=", g.M, " N=", g.N);
  if (g.K == 0 || g.alpha == 0.0f) {
    scale_c(g);
    return;
  }
  const int64_t a_cols = g.trans_a ? g.M : g.K;
  const int64_t b_cols = g.trans_b ? g.K : g.N;
  MINIDL_CHECK(g.lda >= a_cols, "sgemm: lda=", g.lda, " is less than the ", a_cols,
               " columns of A (trans_a=", g.trans_a, ")");
  MINIDL_CHECK(g.ldb >= b_cols, "sgemm: ldb=", g.ldb, " is less than the ", b_cols,
               " columns of B (trans_b=", g.trans_b, ")");
  MINIDL_CHECK(g.A != nullptr && g.B != nullptr, "sgemm: A or B is null for M=", g.M, " N=", g.N,
               " K=", g.K);

  const Kernels& kn = active_kernels();
  int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const int64_t fma = g.M * g.N * g.K;
  threads = static_cast<int>(std::clamp<int64_t>(fma / kMinFmaPerThread, 1, threads));
  if (g.update == nullptr && short_k_case(kn, g)) {
    const NarrowFn short_k = kShortK[static_cast<std::size_t>(g.N / 16 - 1)];
    if (threads == 1) return short_k(g, 0, g.M);
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      short_k(g, g.M * t / nt, g.M * (t + 1) / nt);
    }
    return;
  }
  if (g.update == nullptr && narrow_case(kn, g)) {
    // Rows of C split over the threads; each element's sum is the same whoever computes it.
    const NarrowFn narrow = kNarrow[static_cast<std::size_t>(g.N - 1)];
    if (threads == 1) return narrow(g, 0, g.M);
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      narrow(g, g.M * t / nt, g.M * (t + 1) / nt);
    }
    return;
  }
  if (threads == 1) {
    gemm_block(kn, g, 0, g.M, 0, g.N);
    return;
  }
  const Partition part = choose_partition(kn, g.M, g.N, g.K, threads, g.update == nullptr);
  std::exception_ptr error;
  const int blocks = part.tm * part.tn;
#pragma omp parallel num_threads(blocks)
  {
    // The runtime may grant fewer threads than asked (OMP_DYNAMIC, thread limits): stride over
    // the blocks so that every one is computed regardless.
    for (int b = omp_get_thread_num(); b < blocks; b += omp_get_num_threads()) {
      const int64_t i0 = (b / part.tn) * part.rows;
      const int64_t j0 = (b % part.tn) * part.cols;
      if (i0 >= g.M || j0 >= g.N) continue;
      try {
        gemm_block(kn, g, i0, std::min(part.rows, g.M - i0), j0, std::min(part.cols, g.N - j0));
      } catch (...) {  // exceptions must not leave an OpenMP region; rethrow one after the join
#pragma omp critical(minidl_sgemm_error)
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
           const GemmEpilogue& epilogue) {
  sgemm_impl({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue.bias,
              epilogue.relu});
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm_impl({trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, false});
}

bool sgemm_momentum(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                    const GemmMomentum& update) {
  const Kernels& kn = active_kernels();
  if (&kn != &kAvx512 || K > kn.kc || K == 0 || alpha == 0.0f) return false;
  MINIDL_CHECK(update.velocity != nullptr, "sgemm_momentum: no velocity for M=", M, " N=", N);
  GemmArgs g{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, nullptr, false};
  g.update = &update;
  sgemm_impl(g);
  return true;
}

const char* sgemm_isa() { return active_kernels().name; }

void sgemm_force_isa(const char* isa) {
  if (isa == nullptr || *isa == '\0') {
    g_forced.store(nullptr);
    return;
  }
  g_forced.store(kernels_by_name(isa));
}

}  // namespace minidl::native
