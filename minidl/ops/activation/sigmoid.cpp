// sigmoid: y = 1 / (1 + exp(-x)); sigmoid_bwd(dy, y) -> dx.
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

extern "C" __attribute__((simd("notinbranch"))) float expf(float) noexcept;

namespace minidl::ops {
namespace {

// Two branches so that exp never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) otherwise, with
// e = exp(-|x|). Compiled for AVX-512 and AVX2 too: glibc's vector math library (libmvec) has expf
// for 4, 8 and 16 lanes, which glibc's header declares only under -ffast-math, so the declaration
// is repeated below; this file compiles without errno, which nothing reads, so that GCC calls it.
__attribute__((target_clones("avx512f", "avx2", "default"))) void sigmoid_range(const float* x,
                                                                                float* y,
                                                                                std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float e = expf(-std::fabs(x[i]));
    y[i] = (x[i] >= 0.0f ? 1.0f : e) / (1.0f + e);
  }
}

void sigmoid_native(const ir::KernelArgs& k) {
  const float* x = k.in[0].data<float>();
  float* y = k.out[0].data<float>();
  elementwise(k.in[0].numel(),
              [&](std::int64_t b, std::int64_t e) { sigmoid_range(x + b, y + b, e - b); });
}

// The derivative from the output, y (1 - y), so the backward needs no exp.
void sigmoid_bwd_native(const ir::KernelArgs& k) {
  map_binary(k, [](float dy, float y) { return dy * y * (1.0f - y); });
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_sigmoid_bwd, {g.out_grad(0), g.output(0)}));
}

}  // namespace

MINIDL_OP(sigmoid)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::sigmoid_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, sigmoid_native)
    .grad(grad);

MINIDL_OP(sigmoid_bwd)
    .inputs({"dy", "y"})
    .outputs({"dx"})
    .infer(infer_same_shapes)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::sigmoid_bwd_kernel,
                    onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, sigmoid_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
