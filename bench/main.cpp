// minidl_bench: Google Benchmark microbenchmarks of minidl's kernels on each backend. Names are
// "<bench>/<backend>/<shape>" (conv2d_fwd/onednn/N32_C3_H32_W32_K32_R3); run with
// --benchmark_filter=REGEX to pick some, or through scripts/bench for the Markdown tables.
// Besides Google Benchmark's flags it takes --minidl_time=real|process_cpu (see bench.hpp) and
// --minidl_kernels=simd|portable (below).
// Exits non-zero when a benchmark failed (a backend declining a node is a skip, not a failure)
// or when the filter matched nothing.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstdio>
#include <string_view>

#include "bench.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/native/gemm.hpp"
#include "minidl/ops/native/im2col.hpp"
#include "minidl/ops/nn/max_pool2d_lanes.hpp"

#if MINIDL_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace minidl::bench {
namespace {
int g_failures = 0;
Timer g_timer = Timer::Real;
}  // namespace

void set_timer(Timer t) { g_timer = t; }

void configure(benchmark::internal::Benchmark* b) {
  // The kernels run on OpenMP threads: by default wall time, not the calling thread's CPU time.
  if (g_timer == Timer::Real) {
    b->UseRealTime();
  } else {
    b->MeasureProcessCPUTime();
  }
  b->Unit(benchmark::kMicrosecond);
}

void count_failure() { ++g_failures; }
int failures() { return g_failures; }

std::string bench_name(const std::string& bench, const std::string& backend,
                       const std::string& shape) {
  return fmt::format("{}/{}/{}", bench, backend, shape);
}

}  // namespace minidl::bench

namespace {

/// Takes --minidl_time=real|process_cpu and --minidl_kernels=simd|portable out of argv (Google
/// Benchmark rejects flags it does not know); false after printing an error for a bad value.
/// --minidl_kernels=portable runs the portable native kernels that CPUs without AVX-512 get in
/// place of the AVX-512 ones chosen at run time (max pooling, im2col), for an A/B on one machine.
bool parse_own_flags(int* argc, char** argv, std::string_view* time, std::string_view* kernels) {
  constexpr std::string_view kTime = "--minidl_time=", kKernels = "--minidl_kernels=";
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with(kKernels)) {
      const std::string_view value = arg.substr(kKernels.size());
      *kernels = value;
      if (value != "simd" && value != "portable") {
        std::fprintf(stderr,
                     "minidl_bench: --minidl_kernels must be simd or portable, got '%.*s'\n",
                     static_cast<int>(value.size()), value.data());
        return false;
      }
      const bool portable = value == "portable";
      minidl::ops::pool::force_portable(portable);
      minidl::native::im2col_force_portable(portable);
      continue;
    }
    if (!arg.starts_with(kTime)) {
      argv[kept++] = argv[i];
      continue;
    }
    const std::string_view value = arg.substr(kTime.size());
    *time = value;
    if (value == "real") {
      minidl::bench::set_timer(minidl::bench::Timer::Real);
    } else if (value == "process_cpu") {
      minidl::bench::set_timer(minidl::bench::Timer::ProcessCpu);
    } else {
      std::fprintf(stderr, "minidl_bench: --minidl_time must be real or process_cpu, got '%.*s'\n",
                   static_cast<int>(value.size()), value.data());
      return false;
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view time = "real", kernels = "simd";
  if (!parse_own_flags(&argc, argv, &time, &kernels)) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  minidl::bench::register_op_benchmarks();
  minidl::bench::register_gemm_benchmarks();
  minidl::bench::register_stream_benchmarks();
  minidl::bench::register_peak_benchmarks();
  benchmark::AddCustomContext("minidl_time", std::string(time));
  benchmark::AddCustomContext("minidl_kernels", std::string(kernels));
  benchmark::AddCustomContext("omp_threads", std::to_string(minidl::max_threads()));
  benchmark::AddCustomContext("minidl_sgemm_isa", minidl::native::sgemm_isa());
#if MINIDL_WITH_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  benchmark::AddCustomContext("onednn", fmt::format("{}.{}.{} ({})", v->major, v->minor, v->patch,
                                                    v->hash != nullptr ? v->hash : "?"));
#else
  benchmark::AddCustomContext("onednn", "not built (MINIDL_WITH_ONEDNN=OFF)");
#endif
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ran == 0) {
    std::fprintf(stderr, "minidl_bench: no benchmark matched the filter\n");
    return 1;
  }
  if (minidl::bench::failures() > 0) {
    std::fprintf(stderr, "minidl_bench: %d benchmark(s) failed (see their error messages)\n",
                 minidl::bench::failures());
    return 1;
  }
  return 0;
}
