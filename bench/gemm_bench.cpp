// The GEMM sweep: minidl::native::sgemm against oneDNN's dnnl_sgemm (its C API, row-major like
// ours) on square sizes and on the MNIST MLP's products at batch 64, called directly with no
// graph around them. C = A B with beta = 0, so neither reads C.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/native/gemm.hpp"

#if MINIDL_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace minidl::bench {
namespace {

using std::int64_t;

struct Gemm {
  int64_t m, n, k;
  bool trans_a, trans_b;
  std::string shape() const {
    return fmt::format("M{}_K{}_N{}_{}{}", m, k, n, trans_a ? 'T' : 'N', trans_b ? 'T' : 'N');
  }
};

std::vector<Gemm> gemm_cases() {
  std::vector<Gemm> cases;
  for (int64_t s : {64, 128, 256, 384, 512, 768, 1024}) cases.push_back({s, s, s, false, false});
  // Each MLP layer y[64,n] = x[64,k] w[k,n]: forward, dX = dY W^T, dW = X^T dY.
  for (auto [k, n] : {std::pair<int64_t, int64_t>{784, 256}, {256, 128}, {128, 10}}) {
    cases.push_back({64, n, k, false, false});
    cases.push_back({64, k, n, false, true});
    cases.push_back({k, n, 64, true, false});
  }
  return cases;
}

/// Operands of g: A [M,K] ([K,M] when trans_a), B [K,N] ([N,K] when trans_b), C [M,N].
struct Operands {
  Tensor a, b, c;
  int64_t lda, ldb, ldc;
  explicit Operands(const Gemm& g)
      : a(Tensor::empty(g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k})),
        b(Tensor::empty(g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n})),
        c(Tensor::empty(Shape{g.m, g.n})),
        lda(a.shape()[1]),
        ldb(b.shape()[1]),
        ldc(g.n) {
    const CounterRng rng(7);
    rng.fill_uniform(a, 0, -1.0f, 1.0f);
    rng.fill_uniform(b, 1, -1.0f, 1.0f);
  }
};

void set_flops(benchmark::State& state, const Gemm& g) {
  state.counters["FLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k),
      benchmark::Counter::kIsIterationInvariantRate);
}

void native_gemm(benchmark::State& state, const Gemm& g) {
  try {
    Operands o(g);
    auto run = [&] {
      native::sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, o.a.data<float>(), o.lda,
                    o.b.data<float>(), o.ldb, 0.0f, o.c.data<float>(), o.ldc);
    };
    run();
    for (auto _ : state) run();
    set_flops(state, g);
    state.SetLabel(native::sgemm_isa());
  } catch (const std::exception& e) {
    count_failure();
    state.SkipWithError(fmt::format("failed: {}", e.what()).c_str());
  }
}

void onednn_gemm(benchmark::State& state, const Gemm& g) {
#if MINIDL_WITH_ONEDNN
  Operands o(g);
  auto run = [&] {
    return dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.m, g.n, g.k, 1.0f,
                      o.a.data<float>(), o.lda, o.b.data<float>(), o.ldb, 0.0f, o.c.data<float>(),
                      o.ldc);
  };
  if (const dnnl_status_t st = run(); st != dnnl_success) {
    count_failure();
    state.SkipWithError(
        fmt::format("failed: dnnl_sgemm returned status {}", static_cast<int>(st)).c_str());
    return;
  }
  for (auto _ : state) run();
  set_flops(state, g);
  state.SetLabel("dnnl_sgemm");
#else
  state.SkipWithError("built without oneDNN (MINIDL_WITH_ONEDNN=OFF)");
#endif
}

}  // namespace

void register_gemm_benchmarks() {
  for (const Gemm& g : gemm_cases()) {
    configure(benchmark::RegisterBenchmark(bench_name("sgemm", "native", g.shape()).c_str(),
                                           [g](benchmark::State& s) { native_gemm(s, g); }));
    configure(benchmark::RegisterBenchmark(bench_name("sgemm", "onednn", g.shape()).c_str(),
                                           [g](benchmark::State& s) { onednn_gemm(s, g); }));
  }
}

}  // namespace minidl::bench
