// The memory bandwidth bound the memory-bound rows are read against: STREAM's copy (b = a) and
// triad (a = b + s * c) over float arrays, on 1 thread and on every thread, at sizes of the
// models' activations (which stay in the caches between kernels) and at one size larger than the
// last-level cache. Names are "stream_copy/t<threads>/S<bytes per array>"; the rate counts the
// bytes the kernel must move (copy 2 arrays, triad 3, each read or written once), as STREAM does
// and as the op rows' bytes/s counters do, so a kernel's GB/s over this row's is its share of the
// bound at that size and thread count.
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bench.hpp"
#include "minidl/core/threading.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace minidl::bench {
namespace {

using std::int64_t;

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer make_buffer(int64_t floats) {
  const std::size_t bytes = (static_cast<std::size_t>(floats) * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

/// Runs fn(begin, end) over [0, n) split evenly over `threads` threads (as minidl::parallel_for
/// splits), so each thread touches the same part in the first touch and in every pass.
template <typename Fn>
void split(int threads, int64_t n, Fn&& fn) {
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    fn(n * t / nt, n * (t + 1) / nt);
  }
#else
  (void)threads;
  fn(int64_t{0}, n);
#endif
}

enum class Kind { Copy, Triad };

void run_stream(benchmark::State& state, Kind kind, int threads, int64_t bytes) {
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  Buffer a = make_buffer(n), b = make_buffer(n), c = make_buffer(n);
  if (!a || !b || !c) {
    state.SkipWithError(fmt::format("cannot allocate 3 arrays of {} bytes", bytes).c_str());
    return;
  }
  split(threads, n, [&](int64_t i0, int64_t i1) {
    std::fill(a.get() + i0, a.get() + i1, 1.0f);
    std::fill(b.get() + i0, b.get() + i1, 2.0f);
    std::fill(c.get() + i0, c.get() + i1, 0.5f);
  });
  float* pa = a.get();
  float* pb = b.get();
  const float* pc = c.get();
  const float s = 3.0f;
  auto pass = [&] {
    if (kind == Kind::Copy) {
      split(threads, n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) pb[i] = pa[i];
      });
    } else {
      split(threads, n, [&](int64_t i0, int64_t i1) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) pa[i] = pb[i] + s * pc[i];
      });
    }
  };
  pass();  // first pass outside the timing, as the op rows run their node once first
  for (auto _ : state) {
    pass();
    benchmark::ClobberMemory();
  }
  const double moved = static_cast<double>(bytes) * (kind == Kind::Copy ? 2.0 : 3.0);
  state.counters["bytes/s"] =
      benchmark::Counter(moved, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("{} threads", threads));
}

/// Bytes per array larger than the last-level cache: twice its size as the OS reports it (at least
/// 64 MiB, at most 1 GiB, a multiple of 1 MiB).
int64_t beyond_caches() {
  long llc = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  if (llc <= 0) {
#if defined(_SC_LEVEL2_CACHE_SIZE)
    llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  }
  const int64_t mib = int64_t{1} << 20;
  const int64_t want =
      std::clamp<int64_t>(2 * static_cast<int64_t>(std::max(llc, 0L)), 64 * mib, 1024 * mib);
  return want / mib * mib;
}

std::string size_label(int64_t bytes) {
  if (bytes % (int64_t{1} << 20) == 0) return fmt::format("S{}MiB", bytes >> 20);
  return fmt::format("S{}KiB", bytes >> 10);
}

}  // namespace

void register_stream_benchmarks() {
  // The pooled activations: the MNIST CNN's 32x8x26x26 (676 KiB), the CIFAR CNN's 32x64x16x16
  // (2 MiB) and 32x32x32x32 (4 MiB); 16 MiB; and beyond the last-level cache.
  const int64_t kib = 1024;
  const std::vector<int64_t> sizes = {676 * kib, 2048 * kib, 4096 * kib, 16384 * kib,
                                      beyond_caches()};
  std::vector<int> thread_counts = {1};
  if (max_threads() > 1) thread_counts.push_back(max_threads());
  for (const auto& [kind, name] :
       {std::pair{Kind::Copy, "stream_copy"}, std::pair{Kind::Triad, "stream_triad"}}) {
    for (const int t : thread_counts) {
      for (const int64_t bytes : sizes) {
        const std::string full = bench_name(name, fmt::format("t{}", t), size_label(bytes));
        const Kind k = kind;
        configure(benchmark::RegisterBenchmark(
            full.c_str(), [k, t, bytes](benchmark::State& s) { run_stream(s, k, t, bytes); }));
      }
    }
  }
}

}  // namespace minidl::bench
