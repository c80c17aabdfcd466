// Shared by the minidl_bench sources: what each file registers, and the count of benchmarks that
// failed (as opposed to a backend declining a node, which is a skip), so main() can exit non-zero.
#pragma once

#include <benchmark/benchmark.h>

#include <string>

namespace minidl::bench {

/// One benchmark per case x backend: every op of the three models (MNIST MLP, MNIST CNN, CIFAR
/// CNN) forward and backward, each a one-node graph compiled by runtime::Executable.
void register_op_benchmarks();

/// The GEMM sweep: minidl::native::sgemm against oneDNN's dnnl_sgemm on square sizes and on the
/// MLP's products.
void register_gemm_benchmarks();

/// The memory bandwidth bound: STREAM copy and triad at the activations' sizes and beyond the
/// last-level cache, on 1 thread and on every thread (stream_bench.cpp).
void register_stream_benchmarks();

/// The compute bound: a loop of independent multiply-adds as f32 FMAs and as AVX512-BF16 dot
/// products, on 1 thread and on every thread (peak_bench.cpp).
void register_peak_benchmarks();

/// Records a failed benchmark (graph, compile or run error); main() then exits non-zero.
void count_failure();
int failures();

/// What the benchmarks time: wall-clock time (the default; Google Benchmark appends /real_time to
/// the names), or the CPU time of the whole process (/process_time), which a single-threaded run
/// on a shared machine does not lose to other processes. Set from --minidl_time by main().
enum class Timer { Real, ProcessCpu };
void set_timer(Timer t);
/// Applies the timer and the unit (microseconds) to a registered benchmark.
void configure(benchmark::internal::Benchmark* b);

/// Benchmark name "<bench>/<backend>/<shape>", the form scripts/bench parses.
std::string bench_name(const std::string& bench, const std::string& backend,
                       const std::string& shape);

}  // namespace minidl::bench
