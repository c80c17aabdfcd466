// Native SGEMM in the BLIS/GotoBLAS layout: cache-blocked loops around packed panels and a
// register-blocked micro-kernel per ISA (AVX-512, AVX2+FMA, portable C++), picked at run time.
//
// Loop nest for one thread's block of C (jc -> pc -> ic -> jr -> ir):
//   jc: NC columns of C      op(B)[pc:pc+kc, jc:jc+nc] packed into NR-wide panels (L2/L3)
//   pc: KC of the K axis     one pass over C per kc block; beta on the first, epilogue on the last
//   ic: MC rows of C         op(A)[ic:ic+mc, pc:pc+kc] packed into MR-wide panels (L2)
//   jr, ir: micro-tiles      an NR x kc B panel stays in L1 while the MR x kc A panels stream by
// Both packers write "k outer, panel width inner", so the micro-kernel reads a single layout
// whatever the transposes are, and zero padding makes edge tiles compute like full ones; only
// the store to C is masked.
#include "minidl/ops/native/gemm.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string_view>

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

/// How a finished tile is written back: C = relu?(alpha * acc + beta * C + bias).
struct TileStore {
  float alpha;
  float beta;         // 0 means C is not read
  const float* bias;  // first column of this tile, or nullptr
  bool relu;
};

/// C[mr, nr] (row stride ldc) <- store(sum_k pa[k][0:MR] (x) pb[k][0:NR]), mr <= MR, nr <= NR.
using MicroKernel = void (*)(int64_t kc, const float* pa, const float* pb, float* c, int64_t ldc,
                             int mr, int nr, const TileStore& st);

/// Packs an n x kc block into ceil(n / W) panels; panel p holds element (p * W + w, k) at
/// dst[p * W * kc + k * W + w] and zeros for w past n. Element (w, k) is src[k * ld + w] when
/// w_contig, else src[w * ld + k], which covers A (w = row of C) and B (w = column of C) with
/// either transpose.
using PackFn = void (*)(const float* src, int64_t ld, bool w_contig, int64_t n, int64_t kc,
                        float* dst);

struct Kernels {
  const char* name;
  int mr;
  int nr;
  int64_t mc;  // upper bounds of the cache blocks; the driver balances them per problem
  int64_t kc;
  int64_t nc;
  MicroKernel micro;
  PackFn pack_a;
  PackFn pack_b;
};

// ---------------------------------------------------------------------------------------------
// Portable fallback: plain loops that the compiler vectorises for the baseline ISA.

template <int W>
void pack_generic(const float* src, int64_t ld, bool w_contig, int64_t n, int64_t kc, float* dst) {
  for (int64_t p = 0; p < n; p += W, dst += W * kc) {
    const int64_t w = std::min<int64_t>(W, n - p);
    for (int64_t k = 0; k < kc; ++k) {
      float* d = dst + k * W;
      if (w_contig) {
        const float* s = src + k * ld + p;
        for (int64_t i = 0; i < w; ++i) d[i] = s[i];
      } else {
        const float* s = src + p * ld + k;
        for (int64_t i = 0; i < w; ++i) d[i] = s[i * ld];
      }
      for (int64_t i = w; i < W; ++i) d[i] = 0.0f;
    }
  }
}

float apply_store(float acc, float* c, const TileStore& st, int64_t j) {
  float x = st.alpha * acc;
  if (st.beta != 0.0f) x += st.beta * *c;
  if (st.bias != nullptr) x += st.bias[j];
  // (x > 0 ? x : 0), not std::max: NaN maps to 0, matching _mm*_max_ps(x, 0) in the SIMD paths.
  if (st.relu) x = x > 0.0f ? x : 0.0f;
  return x;
}

template <int MR, int NR>
void kernel_generic(int64_t kc, const float* pa, const float* pb, float* c, int64_t ldc, int mr,
                    int nr, const TileStore& st) {
  float acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k, pa += MR, pb += NR) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; ++j) acc[i][j] += pa[i] * pb[j];
    }
  }
  for (int i = 0; i < mr; ++i) {
    float* row = c + i * ldc;
    for (int j = 0; j < nr; ++j) row[j] = apply_store(acc[i][j], row + j, st, j);
  }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA. Packing uses only AVX, so the AVX-512 kernel set reuses these packers.

#define MINIDL_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define MINIDL_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma")))

/// dst[k * dst_ld + r] = src[r * ld + k] for an 8 x 8 block. Loading 128-bit halves straight into
/// the two lanes does the cross-lane step with loads, leaving 16 in-lane shuffles.
MINIDL_TARGET_AVX2 inline __m256 load_rows_r_r4(const float* src, int64_t ld) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(src)), _mm_loadu_ps(src + 4 * ld),
                              1);
}

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

template <int W>
MINIDL_TARGET_AVX2 void pack_avx2(const float* src, int64_t ld, bool w_contig, int64_t n,
                                  int64_t kc, float* dst) {
  static_assert(W % 8 == 0, "panel width must be whole AVX vectors");
  for (int64_t p = 0; p < n; p += W, dst += W * kc) {
    const int64_t w = std::min<int64_t>(W, n - p);
    if (w_contig) {
      const float* s = src + p;
      if (w == W) {
        for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 8
          for (int i = 0; i < W; i += 8) {
            _mm256_store_ps(dst + k * W + i, _mm256_loadu_ps(s + k * ld + i));
          }
        }
      } else {
        for (int64_t k = 0; k < kc; ++k) {
          float* d = dst + k * W;
          int64_t i = 0;
          for (; i < w; ++i) d[i] = s[k * ld + i];
          for (; i < W; ++i) d[i] = 0.0f;
        }
      }
      continue;
    }
    // w_contig == false: each of the w source rows is contiguous along k, so transpose 8x8 blocks
    // and mop up the ragged edges element by element.
    const float* s = src + p * ld;
    const int64_t w8 = w / 8 * 8;
    const int64_t k8 = kc / 8 * 8;
    for (int64_t i = 0; i < w8; i += 8) {
      for (int64_t k = 0; k < k8; k += 8) transpose_8x8(s + i * ld + k, ld, dst + k * W + i, W);
      for (int64_t k = k8; k < kc; ++k) {
        for (int64_t r = i; r < i + 8; ++r) dst[k * W + r] = s[r * ld + k];
      }
    }
    for (int64_t r = w8; r < w; ++r) {
      for (int64_t k = 0; k < kc; ++k) dst[k * W + r] = s[r * ld + k];
    }
    if (w < W) {
      for (int64_t k = 0; k < kc; ++k) std::fill(dst + k * W + w, dst + k * W + W, 0.0f);
    }
  }
}

/// Lane masks for maskload/maskstore: kLaneMask + 8 - n enables the first n of 8 lanes.
alignas(64) constexpr int kLaneMask[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

template <int MR, int NV>
MINIDL_TARGET_AVX2 void kernel_avx2(int64_t kc, const float* pa, const float* pb, float* c,
                                    int64_t ldc, int mr, int nr, const TileStore& st) {
  constexpr int NR = 8 * NV;
  __m256 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k, pa += MR, pb += NR) {
    __m256 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm256_load_ps(pb + 8 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(pa + i);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }

  __m256i mask[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int lanes = std::clamp(nr - 8 * v, 0, 8);
    mask[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneMask + 8 - lanes));
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
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
    float* row = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m256 x = _mm256_mul_ps(acc[i][v], alpha);
      if (st.beta != 0.0f) x = _mm256_fmadd_ps(_mm256_maskload_ps(row + 8 * v, mask[v]), beta, x);
      x = _mm256_add_ps(x, bias[v]);
      if (st.relu) x = _mm256_max_ps(x, zero);
      _mm256_maskstore_ps(row + 8 * v, mask[v], x);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AVX-512.

template <int MR, int NV>
MINIDL_TARGET_AVX512 void kernel_avx512(int64_t kc, const float* pa, const float* pb, float* c,
                                        int64_t ldc, int mr, int nr, const TileStore& st) {
  constexpr int NR = 16 * NV;
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  }
#ifdef XPFC
  // C is read only after the k loop; start its (likely L2/L3) lines coming now.
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * v), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + NR - 1), _MM_HINT_T0);
  }
#endif
  for (int64_t k = 0; k < kc; ++k, pa += MR, pb += NR) {
    __m512 b[NV];
#ifdef XPFA
    if ((k & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(pa + XPFA), _MM_HINT_T0);
#endif
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = _mm512_load_ps(pb + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a = _mm512_set1_ps(pa[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }

  __mmask16 mask[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int lanes = std::clamp(nr - 16 * v, 0, 16);
    mask[v] = static_cast<__mmask16>((1u << lanes) - 1u);
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
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
    float* row = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 x = _mm512_mul_ps(acc[i][v], alpha);
      if (st.beta != 0.0f) {
        x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask[v], row + 16 * v), beta, x);
      }
      x = _mm512_add_ps(x, bias[v]);
      // maskz_mov on (x > 0) rather than max_ps, whose GCC 12 header trips -Wmaybe-uninitialized.
      if (st.relu) x = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), x);
      _mm512_mask_storeu_ps(row + 16 * v, mask[v], x);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel sets. Blocking targets a recent Xeon (48 KiB L1d, 2 MiB L2 per core): the kc x NR B panel
// (kc = 256: 32 KiB for NR = 32) stays in L1 while MR x kc A panels stream from an A block that
// fits L2 with room to spare; NC keeps the packed B block (kc x nc) within L2 as well.

#ifndef XMR
#define XMR 8
#define XNV 2
#define XMC 256
#define XKC 256
#define XNC 2048
#endif
constexpr Kernels kAvx512 = {
    "avx512",           XMR, XNV * 16, XMC, XKC, XNC, kernel_avx512<XMR, XNV>, pack_generic<XMR>,
    pack_avx2<XNV * 16>};
constexpr Kernels kAvx2 = {"avx2",       6, 16, 192, 256, 2048, kernel_avx2<6, 2>, pack_generic<6>,
                           pack_avx2<16>};
constexpr Kernels kGeneric = {
    "generic", 4, 16, 128, 256, 1024, kernel_generic<4, 16>, pack_generic<4>, pack_generic<16>};

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
};

/// C[i0:i0+m, j0:j0+n] of the full product, on the calling thread.
void gemm_block(const Kernels& kn, const GemmArgs& g, int64_t i0, int64_t m, int64_t j0,
                int64_t n) {
  thread_local PackBuffer a_buffer;
  thread_local PackBuffer b_buffer;
  const int64_t mr = kn.mr, nr = kn.nr;
  const int64_t kc_max = balanced_block(g.K, kn.kc, 1);
  const int64_t mc_max = balanced_block(m, kn.mc, mr);
  const int64_t nc_max = balanced_block(n, kn.nc, nr);
  const bool single_ic = mc_max >= m;
  float* a_pack = a_buffer.get(round_up(mc_max, mr) * kc_max);
  float* b_pack = b_buffer.get(round_up(nc_max, nr) * kc_max);

  for (int64_t jc = 0; jc < n; jc += nc_max) {
    const int64_t nc = std::min(nc_max, n - jc);
    const int64_t col = j0 + jc;  // column of C and of op(B)
    for (int64_t pc = 0; pc < g.K; pc += kc_max) {
      const int64_t kc = std::min(kc_max, g.K - pc);
      // op(B)(k, j) is B[k * ldb + j], or B[j * ldb + k] when trans_b.
      const float* b_src = g.trans_b ? g.B + col * g.ldb + pc : g.B + pc * g.ldb + col;

      const bool last = pc + kc == g.K;
      TileStore st{g.alpha, pc == 0 ? g.beta : 1.0f, nullptr, last && g.relu};
      for (int64_t ic = 0; ic < m; ic += mc_max) {
        const int64_t mc = std::min(mc_max, m - ic);
        const int64_t row = i0 + ic;
        // op(A)(i, k) is A[i * lda + k], or A[k * lda + i] when trans_a.
        const float* a_src = g.trans_a ? g.A + pc * g.lda + row : g.A + row * g.lda + pc;
        kn.pack_a(a_src, g.lda, g.trans_a, mc, kc, a_pack);

        for (int64_t jr = 0; jr < nc; jr += nr) {
          // Pack each B panel on the first A block, just before its first use, so the ir loop
          // finds it in L1 instead of in a freshly written buffer that already left for L2/L3.
          // With a single A block no panel is needed twice, so one slot is reused and the packed
          // copy never leaves L1 (the rest of B then stays in L2 across calls).
          float* b_panel_pack = single_ic ? b_pack : b_pack + jr * kc;
          if (ic == 0) {
            const float* b_panel = g.trans_b ? b_src + jr * g.ldb : b_src + jr;
            kn.pack_b(b_panel, g.ldb, !g.trans_b, std::min(nr, nc - jr), kc, b_panel_pack);
          }
          st.bias = last && g.bias != nullptr ? g.bias + col + jr : nullptr;
          float* c_col = g.C + row * g.ldc + col + jr;
          const int nr_cur = static_cast<int>(std::min(nr, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += mr) {
            kn.micro(kc, a_pack + ir * kc, b_panel_pack, c_col + ir * g.ldc, g.ldc,
                     static_cast<int>(std::min(mr, mc - ir)), nr_cur, st);
          }
        }
      }
    }
  }
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

/// The thread grid tm x tn over C and the rows/columns per thread (multiples of MR/NR).
struct Partition {
  int tm = 1, tn = 1;
  int64_t rows = 0, cols = 0;
};

// Below this many multiply-adds per thread, waking a second thread costs more than it saves.
constexpr int64_t kMinFmaPerThread = int64_t{1} << 18;
// Packing one element costs about as much as this many multiply-adds in the micro-kernel; it
// prices the packing that each extra thread duplicates (A for a column split, B for a row split).
constexpr int64_t kPackCost = 8;

Partition choose_partition(const Kernels& kn, int64_t M, int64_t N, int64_t K, int threads) {
  Partition best;
  best.rows = M;
  best.cols = N;
  int64_t best_cost = -1;
  for (int tm = 1; tm <= threads; ++tm) {
    if (threads % tm != 0) continue;
    const int tn = threads / tm;
    const int64_t rows = round_up(ceil_div(M, tm), kn.mr);
    const int64_t cols = round_up(ceil_div(N, tn), kn.nr);
    const int64_t cost = rows * cols * K + kPackCost * (rows + cols) * K;
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
  if (threads == 1) {
    gemm_block(kn, g, 0, g.M, 0, g.N);
    return;
  }
  const Partition part = choose_partition(kn, g.M, g.N, g.K, threads);
  std::exception_ptr error;
#pragma omp parallel num_threads(part.tm* part.tn)
  {
    const int t = omp_get_thread_num();
    const int64_t i0 = (t / part.tn) * part.rows;
    const int64_t j0 = (t % part.tn) * part.cols;
    if (i0 < g.M && j0 < g.N) {
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

const char* sgemm_isa() { return active_kernels().name; }

void sgemm_force_isa(const char* isa) {
  if (isa == nullptr || *isa == '\0') {
    g_forced.store(nullptr);
    return;
  }
  g_forced.store(kernels_by_name(isa));
}

}  // namespace minidl::native
