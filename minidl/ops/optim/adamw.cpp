// adamw: Adam with decoupled weight decay (Loshchilov & Hutter), in place, in PyTorch's order of
// operations (torch.optim.AdamW's single-tensor path), so a matched run agrees to fp32 rounding:
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// t is the optimizer step counted from 1, an i64 input fed every step like the learning rate, so
// neither a schedule nor the bias correction needs recompiling. grad_scale, when present,
// multiplies g first (global-norm clipping).
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  for (int i = 1; i < 4; ++i) {
    MINIDL_CHECK_NODE(c, c.input(i) == c.input(0), "input ", i, " has shape ", c.input(i),
                      ", expected the parameter's ", c.input(0));
  }
  for (int i = 0; i < 4; ++i)
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32");
  check_scalar_input(c, 4, DType::F32);
  check_scalar_input(c, 5, DType::I64);
  check_scalar_input(c, 6, DType::F32);
  const double b1 = c.attr<double>("beta1"), b2 = c.attr<double>("beta2");
  MINIDL_CHECK_NODE(c, b1 >= 0.0 && b1 < 1.0 && b2 >= 0.0 && b2 < 1.0,
                    "betas must lie in [0, 1), got ", b1, " and ", b2);
  MINIDL_CHECK_NODE(c, c.attr<double>("eps") > 0.0, "eps must be positive");
  for (int o = 0; o < 3; ++o) c.set_output(o, c.input(0));
}

struct AdamWRule {
  float grad_scale, decay, step_size, bc2_sqrt, eps, b1, w1, b2, w2;
};

// The update of n elements, in the elementwise clones for AVX-512 and AVX2 (without contraction:
// every CPU gives the same bits). This file is compiled with -fno-math-errno (nothing reads
// errno; v is never negative), without which GCC keeps every square root and division scalar
// (129 us per call on the autoencoder's 128 x 784 weights, a quarter of its step).
MINIDL_ELEMENTWISE_CLONES void adamw_range(float* p, const float* g, float* m, float* v,
                                           std::int64_t n, const AdamWRule& r) {
  const float s = r.grad_scale, decay = r.decay, step_size = r.step_size, bc2_sqrt = r.bc2_sqrt,
              eps = r.eps, fb1 = r.b1, w1 = r.w1, fb2 = r.b2, w2 = r.w2;
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float gi = s * g[i];
    p[i] *= decay;
    m[i] = m[i] * fb1 + w1 * gi;
    v[i] = v[i] * fb2 + w2 * gi * gi;
    const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
    p[i] += -step_size * m[i] / denom;
  }
}

void adamw_native(const ir::KernelArgs& k) {
  float* p = k.in[0].data<float>();
  const float* g = k.in[1].data<float>();
  float* m = k.in[2].data<float>();
  float* v = k.in[3].data<float>();
  const double lr = *k.in[4].data<float>();
  const std::int64_t t = *k.in[5].data<std::int64_t>();
  MINIDL_CHECK(t >= 1, k.node->describe(), ": optimizer step ", t, " (expected >= 1)");
  const double b1 = k.attrs().get<double>("beta1"), b2 = k.attrs().get<double>("beta2");
  const AdamWRule rule{
      .grad_scale = scalar_input(k, 6, 1.0f),
      .decay = static_cast<float>(1.0 - lr * k.attrs().get<double>("weight_decay")),
      .step_size = static_cast<float>(lr / (1.0 - std::pow(b1, static_cast<double>(t)))),
      .bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(t)))),
      .eps = static_cast<float>(k.attrs().get<double>("eps")),
      .b1 = static_cast<float>(b1),
      .w1 = static_cast<float>(1.0 - b1),
      .b2 = static_cast<float>(b2),
      .w2 = static_cast<float>(1.0 - b2)};
  elementwise(k.in[0].numel(), [&](std::int64_t b, std::int64_t e) {
    adamw_range(p + b, g + b, m + b, v + b, e - b, rule);
  });
}

}  // namespace

MINIDL_OP(adamw)
    .inputs({"param", "grad", "exp_avg", "exp_avg_sq", "lr", "step", "grad_scale?"})
    .outputs({"param_out", "exp_avg_out", "exp_avg_sq_out"})
    .attr<double>("beta1", 0.9)
    .attr<double>("beta2", 0.999)
    .attr<double>("eps", 1e-8)
    .attr<double>("weight_decay", 0.0)
    .infer(infer)
    .kernel(ir::Backend::Native, adamw_native)
    .inplace(0, 0)
    .inplace(1, 2)
    .inplace(2, 3)
    .update(0, 1, 6)
    .side_effect()
    .no_grad("an optimizer update");

}  // namespace minidl::ops
