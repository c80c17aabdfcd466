// The SGD-with-momentum rule on a range of elements, shared by the sgd_momentum op and the
// product that computes a gradient block by block and updates with it (matmul_sgd_momentum), so
// that both give the same bits from the same gradient. The loop runs in clones for AVX-512 and
// AVX2 without contraction (MINIDL_ELEMENTWISE_CLONES): the same bits on every CPU.
#pragma once

#include <cstdint>

#include "minidl/ops/common.hpp"

namespace minidl::ops {

struct MomentumRule {
  float lr = 0.0f;
  float grad_scale = 1.0f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

/// For i in [0, n): g' = s g + wd p; v = mu v + g'; p -= lr (g' + mu v) with nesterov, p -= lr v
/// without (PyTorch's form: the first step sets v = g', as zero v does).
MINIDL_ELEMENTWISE_CLONES inline void sgd_momentum_range(float* p, const float* g, float* v,
                                                         std::int64_t n, const MomentumRule& r) {
  const float lr = r.lr, s = r.grad_scale, mu = r.momentum, wd = r.weight_decay;
  if (r.nesterov) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const float d = s * g[i] + wd * p[i];
      v[i] = mu * v[i] + d;
      p[i] -= lr * (d + mu * v[i]);
    }
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      v[i] = mu * v[i] + (s * g[i] + wd * p[i]);
      p[i] -= lr * v[i];
    }
  }
}

}  // namespace minidl::ops
