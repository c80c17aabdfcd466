// bf16_copy: y = x, a copy that bf16 products share. With --precision bf16 the mixed-precision
// pass (ops/precision.cpp) gives every value that two or more bf16 products read as a factor one
// such copy, stored as bf16 (ir::Value::stored), and points the products at it: the value is
// rounded to bf16 once per step (ties to even, as oneDNN's reorders round) instead of inside each
// product. The value stays f32 for the shape rules, so the copy is exact where y is stored as
// f32; the gradient passes through unchanged (dx = dy), as it does through a product's own
// rounding of its factors.
#include <cstring>

#include "minidl/ops/bf16_round.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

inline float from_bf16(std::uint16_t v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// n elements rounded to bf16; compiled for AVX2 too, picked at run time (the default build
// targets no vector extension beyond SSE2, where the narrowing stores stay scalar).
__attribute__((target_clones("avx2", "default"))) void round_to_bf16_any(const float* src,
                                                                         std::uint16_t* dst,
                                                                         std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_round(src[i]);
}

#if defined(__x86_64__)
// The same rounding 16 elements at a time in AVX-512 registers. GCC's clone of the loop above for
// AVX-512 ran in 256-bit vectors, 8 elements per dozen instructions, and took 72 us for the CIFAR
// CNN's fc1 weights (1M elements), as long as reading and writing them from memory.
[[gnu::target("avx512f")]] void round_to_bf16_avx512(const float* src, std::uint16_t* dst,
                                                     std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst + i),
        _mm512_maskz_cvtepi32_epi16(0xffff, bf16_round16(_mm512_loadu_ps(src + i))));
  }
  for (; i < n; ++i) dst[i] = bf16_round(src[i]);
}
#endif

void round_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return round_to_bf16_avx512(src, dst, n);
#endif
  round_to_bf16_any(src, dst, n);
}

// x and y each stored as f32 or bf16 (whatever the layout pass left them as).
void bf16_copy_native(const ir::KernelArgs& k) {
  const Tensor& x = k.in[0];
  const Tensor& y = k.out[0];
  const std::int64_t n = x.numel();
  const bool x16 = x.dtype() == DType::BF16, y16 = y.dtype() == DType::BF16;
  if (x16 == y16) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  if (y16) {
    const float* src = static_cast<const float*>(x.raw());
    auto* dst = static_cast<std::uint16_t*>(y.raw());
    elementwise(n, [&](std::int64_t b, std::int64_t e) { round_to_bf16(src + b, dst + b, e - b); });
    return;
  }
  const auto* src = static_cast<const std::uint16_t*>(x.raw());
  float* dst = static_cast<float*>(y.raw());
  elementwise(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) dst[i] = from_bf16(src[i]);
  });
}

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.out_grad(0)); }

}  // namespace

MINIDL_OP(bf16_copy)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .kernel(ir::Backend::Native, bf16_copy_native)
    .bf16_values()
    .grad(grad);

}  // namespace minidl::ops
