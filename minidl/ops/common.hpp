// Helpers shared by op files: common shape rules and elementwise loops.
#pragma once

#include <algorithm>
#include <string>

#include "minidl/core/threading.hpp"
#include "minidl/ir/graph.hpp"

namespace minidl::ops {

/// A kernel's supports() from its refusal: true when `why` is empty, else false with `why` in
/// *out (when given).
inline bool decline(const std::string& why, std::string* out) {
  if (why.empty()) return true;
  if (out != nullptr) *out = why;
  return false;
}

/// Output 0 has input 0's shape and dtype.
void infer_like_input0(ir::InferCtx& c);
/// All inputs have the same shape as input 0 (f32); output 0 too.
void infer_same_shapes(ir::InferCtx& c);

DType parse_dtype(const std::string& name);

/// The activation fused into a producer (matmul, conv2d): its string attribute `activation`.
enum class Activation { None, Relu };
/// The node's `activation` attribute; fails naming the node and the allowed values otherwise.
Activation activation_attr(ir::InferCtx& c);
/// The same, read by a kernel or gradient rule after shape inference has validated it.
Activation activation_of(const ir::Attrs& attrs);

/// Gradient rule shared by ops computing y = act(f(inputs) + bias), bias being the optional input
/// `bias_input`: returns the gradient of the pre-activation (relu_bwd from y) and sets the bias
/// gradient (summed over all but dimension 1) when one is needed. f's own rule then uses it.
ir::Value* fused_bias_activation_grad(ir::GradCtx& g, int bias_input);

/// fn(begin, end) over [0, n), in parallel when the work is large enough.
template <typename Fn>
void elementwise(std::int64_t n, Fn&& fn) {
  parallel_for(n, 1, std::forward<Fn>(fn));
}

/// The chunk length of fixed_order_sum over n terms: 4096, more past 256 chunks.
inline std::int64_t fixed_order_chunk(std::int64_t n) {
  constexpr std::int64_t kChunk = 4096, kMaxChunks = 256;
  return std::max(kChunk, (n + kMaxChunks - 1) / kMaxChunks);
}

/// The sum of term(i) over [0, n) in double: fixed chunks (fixed_order_chunk) each summed in
/// order, in parallel, and combined in order, so the result has the same bits whatever the
/// thread count (reductions, losses, norms). A sum split at chunk boundaries (ZeRO's shards of
/// a gradient) gives the same bits when its chunks' partial sums are combined in this order.
template <typename Term>
double fixed_order_sum(std::int64_t n, Term term) {
  constexpr std::int64_t kMaxChunks = 256;
  const std::int64_t chunk = fixed_order_chunk(n);
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  double partial[kMaxChunks];
  parallel_for(chunks, chunk, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      double s = 0.0;
      for (std::int64_t i = c * chunk, hi = std::min(n, i + chunk); i < hi; ++i) s += term(i);
      partial[c] = s;
    }
  });
  double total = 0.0;
  for (std::int64_t c = 0; c < chunks; ++c) total += partial[c];
  return total;
}

}  // namespace minidl::ops

namespace minidl::ops {

/// The loops of map_unary and map_binary, compiled for AVX-512 and AVX2 as well as the baseline
/// (which has 4 lanes) and picked at run time: the native ReLU ran at two thirds of oneDNN's
/// speed in SSE2. Without contraction (GCC's optimize attribute), so that no clone fuses a
/// multiply-add that the baseline rounds twice: every CPU gives the same bits.
#define MINIDL_ELEMENTWISE_CLONES \
  __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))

template <typename F>
MINIDL_ELEMENTWISE_CLONES void map_unary_range(const float* x, float* y, std::int64_t n, F f) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

template <typename F>
MINIDL_ELEMENTWISE_CLONES void map_binary_range(const float* a, const float* b, float* y,
                                                std::int64_t n, F f) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
}

/// out[i] = f(in0[i]) over f32 tensors.
template <typename F>
void map_unary(const ir::KernelArgs& k, F f) {
  const float* x = k.in[0].data<float>();
  float* y = k.out[0].data<float>();
  elementwise(k.in[0].numel(),
              [&](std::int64_t b, std::int64_t e) { map_unary_range(x + b, y + b, e - b, f); });
}

/// fn(x + b, y + b, e - b) over the threads' ranges of the f32 input and output: an array
/// function such as vmath::exp.
inline void map_unary_array(const ir::KernelArgs& k,
                            void (*fn)(const float*, float*, std::int64_t)) {
  const float* x = k.in[0].data<float>();
  float* y = k.out[0].data<float>();
  elementwise(k.in[0].numel(), [&](std::int64_t b, std::int64_t e) { fn(x + b, y + b, e - b); });
}

/// out[i] = f(in0[i], in1[i]) over f32 tensors of equal size.
template <typename F>
void map_binary(const ir::KernelArgs& k, F f) {
  const float* a = k.in[0].data<float>();
  const float* b = k.in[1].data<float>();
  float* y = k.out[0].data<float>();
  elementwise(k.in[0].numel(), [&](std::int64_t lo, std::int64_t hi) {
    map_binary_range(a + lo, b + lo, y + lo, hi - lo, f);
  });
}

/// Shape rule of unary f32 ops.
void infer_unary_f32(ir::InferCtx& c);

/// Inside a shape rule: input i, when the node has it, is a single element of dtype (a scalar
/// fed each step, such as the learning rate).
void check_scalar_input(ir::InferCtx& c, int i, DType dtype);
/// The f32 scalar input i, or fallback when the node leaves that optional input out.
float scalar_input(const ir::KernelArgs& k, int i, float fallback);

}  // namespace minidl::ops
