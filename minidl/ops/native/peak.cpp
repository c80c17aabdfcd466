#include "minidl/ops/native/peak.hpp"

#include <algorithm>
#include <chrono>

#include "minidl/core/error.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace minidl::native {
namespace {

constexpr int kChains = 12;  // independent accumulators: more than latency x throughput needs

#if defined(__x86_64__)
bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_dot_bf16() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
}

/// The sum of every lane of the accumulators, in double (exact for the loops' integer values).
template <typename V>
double lane_sum(const V (&acc)[kChains]) {
  double sum = 0;
  for (const V& v : acc) {
    alignas(64) float lanes[sizeof(V) / sizeof(float)];
    std::copy_n(reinterpret_cast<const float*>(&v), sizeof(V) / sizeof(float), lanes);
    for (const float x : lanes) sum += x;
  }
  return sum;
}

// Each loop hides its multiplier from the compiler once per iteration (an empty asm that "changes"
// it), so the iterations stay the instructions they are written as.

__attribute__((target("avx512f"))) double fma_avx512(std::int64_t iterations) {
  __m512 acc[kChains];
  for (int a = 0; a < kChains; ++a) acc[a] = _mm512_set1_ps(static_cast<float>(a));
  __m512 one = _mm512_set1_ps(1.0f);
  const __m512 two = _mm512_set1_ps(2.0f);
  for (std::int64_t i = 0; i < iterations; ++i) {
    asm volatile("" : "+v"(one));
#pragma GCC unroll 12
    for (int a = 0; a < kChains; ++a) acc[a] = _mm512_fmadd_ps(acc[a], one, two);
  }
  return lane_sum(acc);
}

__attribute__((target("avx2,fma"))) double fma_avx2(std::int64_t iterations) {
  __m256 acc[kChains];
  for (int a = 0; a < kChains; ++a) acc[a] = _mm256_set1_ps(static_cast<float>(a));
  __m256 one = _mm256_set1_ps(1.0f);
  const __m256 two = _mm256_set1_ps(2.0f);
  for (std::int64_t i = 0; i < iterations; ++i) {
    asm volatile("" : "+x"(one));
#pragma GCC unroll 12
    for (int a = 0; a < kChains; ++a) acc[a] = _mm256_fmadd_ps(acc[a], one, two);
  }
  return lane_sum(acc);
}

__attribute__((target("avx512f,avx512bf16"))) double dot_bf16(std::int64_t iterations) {
  __m512 acc[kChains];
  for (int a = 0; a < kChains; ++a) acc[a] = _mm512_set1_ps(static_cast<float>(a));
  // Both halves of every 32-bit word are bf16 1.0 (0x3f80): each lane gains 1 * 1 + 1 * 1.
  __m512i ones = _mm512_set1_epi32(0x3f803f80);
  for (std::int64_t i = 0; i < iterations; ++i) {
    asm volatile("" : "+v"(ones));
    const __m512bh x = reinterpret_cast<__m512bh>(ones);
#pragma GCC unroll 12
    for (int a = 0; a < kChains; ++a) acc[a] = _mm512_dpbf16_ps(acc[a], x, x);
  }
  return lane_sum(acc);
}
#endif

}  // namespace

std::string peak_loop_unavailable(PeakLoop loop) {
#if defined(__x86_64__)
  if (loop == PeakLoop::F32Fma)
    return has_avx512() || has_avx2_fma() ? "" : "needs a CPU with AVX-512 or AVX2 with FMA";
  return has_dot_bf16() ? "" : "needs a CPU with AVX512-BF16";
#else
  (void)loop;
  return "needs an x86-64 CPU";
#endif
}

std::string peak_loop_isa(PeakLoop loop) {
  if (!peak_loop_unavailable(loop).empty()) return "";
#if defined(__x86_64__)
  if (loop == PeakLoop::Bf16Dot) return "avx512bf16";
  return has_avx512() ? "avx512" : "avx2";
#else
  return "";
#endif
}

double peak_loop_flops(PeakLoop loop) {
  const std::string isa = peak_loop_isa(loop);
  if (isa.empty()) return 0;
  const double lanes = isa == "avx2" ? 8 : 16;
  return kChains * lanes * (loop == PeakLoop::Bf16Dot ? 4 : 2);
}

double run_peak_loop(PeakLoop loop, std::int64_t iterations) {
  const std::string why = peak_loop_unavailable(loop);
  MINIDL_CHECK(why.empty(), "the peak loop ", why);
  MINIDL_CHECK(iterations >= 0, "the peak loop's iterations must be >= 0, got ", iterations);
#if defined(__x86_64__)
  if (loop == PeakLoop::Bf16Dot) return dot_bf16(iterations);
  return has_avx512() ? fma_avx512(iterations) : fma_avx2(iterations);
#else
  return 0;
#endif
}

double measure_peak(PeakLoop loop) {
  if (!peak_loop_unavailable(loop).empty()) return 0;
  constexpr std::int64_t kIterations = std::int64_t{1} << 15;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    const double sum = run_peak_loop(loop, kIterations);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (sum > 0 && seconds > 0)
      best = std::max(best, kIterations * peak_loop_flops(loop) / seconds / 1e9);
  }
  return best;
}

}  // namespace minidl::native
