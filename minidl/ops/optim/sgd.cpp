// SGD updates as graph nodes, written in place into the parameter (and velocity) buffers. The
// learning rate is an input (a scalar fed every step by the schedule), so changing it needs no
// recompilation; grad_scale, when present, multiplies the gradient first (global-norm clipping).
//   sgd:          g' = s g + wd p;  p -= lr g'
//   sgd_momentum: g' = s g + wd p;  v = mu v + g';  p -= lr (g' + mu v) with nesterov,
//                 p -= lr v without (PyTorch's form: the first step sets v = g', as zero v does);
//                 the loop is ops/optim/sgd.hpp's, which the fused matmul_sgd_momentum shares
#include "minidl/ops/optim/sgd.hpp"

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {

namespace {

// param, grad (same shapes), state inputs of the same shape up to `states`, then lr and the
// optional grad_scale as scalars.
void infer_update(ir::InferCtx& c, int tensors, int lr) {
  for (int i = 1; i < tensors; ++i) {
    MINIDL_CHECK_NODE(c, c.input(i) == c.input(0), "input ", i, " has shape ", c.input(i),
                      ", expected the parameter's ", c.input(0));
  }
  for (int i = 0; i < tensors; ++i)
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32");
  check_scalar_input(c, lr, DType::F32);
  check_scalar_input(c, lr + 1, DType::F32);
  for (int o = 0; o < static_cast<int>(c.node().def().output_names().size()); ++o)
    c.set_output(o, c.input(0));
}

void infer_sgd(ir::InferCtx& c) { infer_update(c, 2, 2); }
void infer_momentum(ir::InferCtx& c) { infer_update(c, 3, 3); }

MINIDL_ELEMENTWISE_CLONES void sgd_range(float* p, const float* g, std::int64_t n, float lr,
                                         float s, float wd) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) p[i] -= lr * (s * g[i] + wd * p[i]);
}

void sgd_native(const ir::KernelArgs& k) {
  float* p = k.in[0].data<float>();
  const float* g = k.in[1].data<float>();
  const float lr = scalar_input(k, 2, 0.0f);
  const float s = scalar_input(k, 3, 1.0f);
  const float wd = k.attrs().get<float>("weight_decay");
  elementwise(k.in[0].numel(),
              [&](std::int64_t b, std::int64_t e) { sgd_range(p + b, g + b, e - b, lr, s, wd); });
}

void sgd_momentum_native(const ir::KernelArgs& k) {
  float* p = k.in[0].data<float>();
  const float* g = k.in[1].data<float>();
  float* v = k.in[2].data<float>();
  const MomentumRule rule{scalar_input(k, 3, 0.0f), scalar_input(k, 4, 1.0f),
                          k.attrs().get<float>("momentum"), k.attrs().get<float>("weight_decay"),
                          k.attrs().get<bool>("nesterov")};
  elementwise(k.in[0].numel(), [&](std::int64_t b, std::int64_t e) {
    sgd_momentum_range(p + b, g + b, v + b, e - b, rule);
  });
}

}  // namespace

MINIDL_OP(sgd)
    .inputs({"param", "grad", "lr", "grad_scale?"})
    .outputs({"param_out"})
    .attr<float>("weight_decay", 0.0f)
    .infer(infer_sgd)
    .kernel(ir::Backend::Native, sgd_native)
    .inplace(0, 0)
    .update(0, 1, 3)
    .side_effect()
    .no_grad("an optimizer update");

MINIDL_OP(sgd_momentum)
    .inputs({"param", "grad", "velocity", "lr", "grad_scale?"})
    .outputs({"param_out", "velocity_out"})
    .attr<float>("momentum")
    .attr<float>("weight_decay", 0.0f)
    .attr<bool>("nesterov", false)
    .infer(infer_momentum)
    .kernel(ir::Backend::Native, sgd_momentum_native)
    .inplace(0, 0)
    .inplace(1, 2)
    .update(0, 1, 4)
    .side_effect()
    .no_grad("an optimizer update");

}  // namespace minidl::ops
