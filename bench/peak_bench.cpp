// The compute bound the products and convolutions are read against, per core and on every
// thread: a loop of 12 independent vector multiply-adds, as f32 FMAs and as AVX512-BF16 dot
// products (native/peak.hpp). Names are "peak_f32_fma/t<threads>/<isa>" and
// "peak_bf16_dot/t<threads>/<isa>"; the rate is FLOP/s (a multiply-add is 2 FLOP, a bf16 pair's
// dot product 4), the unit of the op rows' GFLOP/s. A bf16 row below its f32 row means the CPU's
// bf16 products (without AMX) cannot beat f32 ones, which --precision bf16 warns about.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/native/peak.hpp"

namespace minidl::bench {
namespace {

using native::PeakLoop;

void run_peak(benchmark::State& state, PeakLoop loop, int threads) {
  if (const std::string why = native::peak_loop_unavailable(loop); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  constexpr std::int64_t kIterations = 1 << 15;  // per thread and benchmark iteration
  double sink = 0;
  auto pass = [&] {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += native::run_peak_loop(loop, kIterations);
  };
  pass();  // the vector units' first use (a frequency step on some CPUs) outside the timing
  for (auto _ : state) pass();
  benchmark::DoNotOptimize(sink);
  state.counters["FLOP/s"] =
      benchmark::Counter(static_cast<double>(kIterations) * threads * native::peak_loop_flops(loop),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(fmt::format("{} threads", threads));
}

}  // namespace

void register_peak_benchmarks() {
  std::vector<int> thread_counts = {1};
  if (max_threads() > 1) thread_counts.push_back(max_threads());
  for (const auto& [loop, name] : {std::pair{PeakLoop::F32Fma, "peak_f32_fma"},
                                   std::pair{PeakLoop::Bf16Dot, "peak_bf16_dot"}}) {
    const std::string isa = native::peak_loop_unavailable(loop).empty()
                                ? native::peak_loop_isa(loop)
                                : std::string("unavailable");
    for (const int t : thread_counts) {
      const PeakLoop l = loop;
      configure(benchmark::RegisterBenchmark(bench_name(name, fmt::format("t{}", t), isa).c_str(),
                                             [l, t](benchmark::State& s) { run_peak(s, l, t); }));
    }
  }
}

}  // namespace minidl::bench
