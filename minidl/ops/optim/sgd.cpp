// Optimizer updates as graph nodes, written in place into the parameter (and velocity) buffers.
//   sgd:          p -= lr * (g + weight_decay * p)
//   sgd_momentum: v = momentum * v + (g + weight_decay * p);  p -= lr * v   (PyTorch's form)
#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer_momentum(ir::InferCtx& c) {
  infer_same_shapes(c);
  c.set_output(1, c.input(0));
}

void sgd_native(const ir::KernelArgs& k) {
  float* p = k.in[0].data<float>();
  const float* g = k.in[1].data<float>();
  const float lr = k.attrs().get<float>("lr");
  const float wd = k.attrs().get<float>("weight_decay");
  elementwise(k.in[0].numel(), [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) p[i] -= lr * (g[i] + wd * p[i]);
  });
}

void sgd_momentum_native(const ir::KernelArgs& k) {
  float* p = k.in[0].data<float>();
  const float* g = k.in[1].data<float>();
  float* v = k.in[2].data<float>();
  const float lr = k.attrs().get<float>("lr");
  const float mu = k.attrs().get<float>("momentum");
  const float wd = k.attrs().get<float>("weight_decay");
  elementwise(k.in[0].numel(), [&](std::int64_t b, std::int64_t e) {
#pragma omp simd
    for (std::int64_t i = b; i < e; ++i) {
      v[i] = mu * v[i] + (g[i] + wd * p[i]);
      p[i] -= lr * v[i];
    }
  });
}

}  // namespace

MINIDL_OP(sgd)
    .inputs({"param", "grad"})
    .outputs({"param_out"})
    .attr<float>("lr")
    .attr<float>("weight_decay", 0.0f)
    .infer(infer_same_shapes)
    .kernel(ir::Backend::Native, sgd_native)
    .inplace(0, 0)
    .side_effect()
    .no_grad("an optimizer update");

MINIDL_OP(sgd_momentum)
    .inputs({"param", "grad", "velocity"})
    .outputs({"param_out", "velocity_out"})
    .attr<float>("lr")
    .attr<float>("momentum")
    .attr<float>("weight_decay", 0.0f)
    .infer(infer_momentum)
    .kernel(ir::Backend::Native, sgd_momentum_native)
    .inplace(0, 0)
    .inplace(1, 2)
    .side_effect()
    .no_grad("an optimizer update");

}  // namespace minidl::ops
