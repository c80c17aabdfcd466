// dropout: inverted dropout whose mask is a pure function of (seed, step, global sample, feature).
//   x [N,...] f32, key [2] i64 = (step, global index of sample 0 of this batch slice)
//   -> y = x * mask, mask [N,...] f32
// attrs: p (drop probability, 0 <= p < 1), seed (int; nodes of one graph differ by it).
//
// Element (s, j) of mask, s the sample within x and j its flat feature index, is
//   u = CounterRng(seed).uniform(stream, j) with stream = mix64(mix64(step) + key[1] + s),
//   mask = u >= p ? 1 / (1 - p) : 0.
// So a sample's mask depends on its position in the global batch, never on how the batch was
// split over ranks or threads: the mask of a batch is the concatenation of its slices' masks
// when each slice's key[1] is the global index of its first sample. The trainer feeds the key
// through the graph input "rng_key" (step = global step count since training started); nothing
// else in the graph depends on it. The gradient is dx = dy * mask; the key has none.
#include <algorithm>
#include <cmath>

#include "minidl/core/rng.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  const Shape& key = c.input(1);
  const double p = c.attr<double>("p");
  MINIDL_CHECK_NODE(c, p >= 0.0 && p < 1.0, "p must be in [0, 1), got ", p);
  MINIDL_CHECK_NODE(c, x.rank() >= 1 && c.dtype(0) == DType::F32, "expected f32 x [N,...], got ",
                    c.dtype(0), " ", x);
  MINIDL_CHECK_NODE(c, key.rank() == 1 && key[0] == 2 && c.dtype(1) == DType::I64,
                    "expected key i64 [2] = (step, global index of sample 0), got ", c.dtype(1),
                    " ", key);
  c.set_output(0, x);
  c.set_output(1, x);
}

#if defined(__x86_64__)
#define MINIDL_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl")))
#define MINIDL_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define MINIDL_TARGET_AVX512
#define MINIDL_TARGET_AVX2
#endif

/// Elements [j0, j1) of one sample: its stream's uniforms against the threshold. A uniform is
/// the top 24 bits of CounterRng::bits, so u >= p exactly when those bits >= ceil(p * 2^24).
inline __attribute__((always_inline)) void dropout_row(const CounterRng& rng, std::uint64_t stream,
                                                       std::int64_t j0, std::int64_t j1,
                                                       std::uint64_t threshold, float scale,
                                                       const float* x, float* y, float* mask) {
#pragma omp simd
  for (std::int64_t j = j0; j < j1; ++j) {
    const float m =
        (rng.bits(stream, static_cast<std::uint64_t>(j)) >> 40) >= threshold ? scale : 0.0f;
    mask[j] = m;
    y[j] = x[j] * m;
  }
}

// The mixer's 64-bit multiplies are one instruction with AVX-512DQ (vpmullq) and emulated with
// AVX2; plain x86-64 (SSE2) runs the loop scalar.
MINIDL_TARGET_AVX512 void dropout_row_avx512(const CounterRng& rng, std::uint64_t stream,
                                             std::int64_t j0, std::int64_t j1,
                                             std::uint64_t threshold, float scale, const float* x,
                                             float* y, float* mask) {
  dropout_row(rng, stream, j0, j1, threshold, scale, x, y, mask);
}

MINIDL_TARGET_AVX2 void dropout_row_avx2(const CounterRng& rng, std::uint64_t stream,
                                         std::int64_t j0, std::int64_t j1, std::uint64_t threshold,
                                         float scale, const float* x, float* y, float* mask) {
  dropout_row(rng, stream, j0, j1, threshold, scale, x, y, mask);
}

void dropout_row_generic(const CounterRng& rng, std::uint64_t stream, std::int64_t j0,
                         std::int64_t j1, std::uint64_t threshold, float scale, const float* x,
                         float* y, float* mask) {
  dropout_row(rng, stream, j0, j1, threshold, scale, x, y, mask);
}

using RowFn = void (*)(const CounterRng&, std::uint64_t, std::int64_t, std::int64_t, std::uint64_t,
                       float, const float*, float*, float*);

/// The widest variant this CPU runs.
RowFn pick_row_fn() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return &dropout_row_avx512;
  }
  if (__builtin_cpu_supports("avx2")) return &dropout_row_avx2;
#endif
  return &dropout_row_generic;
}

void dropout_native(const ir::KernelArgs& k) {
  const Shape& s = k.in[0].shape();
  const std::int64_t n = s[0];
  const std::int64_t features = n == 0 ? 0 : s.numel() / n;
  const double p = k.attrs().get<double>("p");
  const CounterRng rng(static_cast<std::uint64_t>(k.attrs().get<std::int64_t>("seed")));
  const std::int64_t* key = k.in[1].data<std::int64_t>();
  const std::uint64_t step_key = mix64(static_cast<std::uint64_t>(key[0]));
  const auto first = static_cast<std::uint64_t>(key[1]);
  const auto threshold = static_cast<std::uint64_t>(std::ceil(p * 0x1.0p24));
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  const float* x = k.in[0].data<float>();
  float* y = k.out[0].data<float>();
  float* mask = k.out[1].data<float>();
  static const RowFn row = pick_row_fn();
  // Split the flat range, not the samples, so that a small batch of large samples is parallel.
  parallel_for(n * features, 8, [&](std::int64_t b, std::int64_t e) {
    while (b < e) {
      const std::int64_t sample = b / features;
      const std::int64_t j0 = b % features;
      const std::int64_t j1 = std::min(features, j0 + (e - b));
      const std::int64_t base = sample * features;
      row(rng, mix64(step_key + first + static_cast<std::uint64_t>(sample)), j0, j1, threshold,
          scale, x + base, y + base, mask + base);
      b += j1 - j0;
    }
  });
}

void grad(ir::GradCtx& g) {
  // The mask does not depend on x, so only y's gradient flows back.
  if (g.needs_input_grad(0) && g.out_grad(0) != nullptr) {
    g.set_input_grad(0, g.op(op_mul, {g.out_grad(0), g.output(1)}));
  }
}

}  // namespace

MINIDL_OP(dropout)
    .inputs({"x", "key"})
    .outputs({"y", "mask"})
    .attr<double>("p")
    .attr<int>("seed", 0)
    .infer(infer)
    .kernel(ir::Backend::Native, dropout_native)
    .grad(grad);

}  // namespace minidl::ops
