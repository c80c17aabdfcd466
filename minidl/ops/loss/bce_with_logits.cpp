// bce_with_logits: binary cross-entropy of sigmoid(x) against targets in [0, 1], averaged over
// all elements, as torch.nn.BCEWithLogitsLoss() (reduction 'mean'):
//   x [...] f32 (logits), target [...] f32 -> loss []
// Each element is max(x, 0) - x t + log(1 + exp(-|x|)): no exp overflows, and a large |x| keeps
// its loss. Summed in double over fixed chunks in order. The backward is (sigmoid(x) - t) dloss /
// n.
#include <algorithm>
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32,
                    "expected f32 logits and target");
  MINIDL_CHECK_NODE(c, c.input(0) == c.input(1), "target ", c.input(1),
                    " does not have the logits' shape ", c.input(0));
  c.set_output(0, Shape{});
}

void bce_with_logits_native(const ir::KernelArgs& k) {
  const float* x = k.in[0].data<float>();
  const float* t = k.in[1].data<float>();
  const std::int64_t n = k.in[0].numel();
  const double total = fixed_order_sum(n, [x, t](std::int64_t i) {
    const double xi = x[i];
    return std::max(xi, 0.0) - xi * t[i] + std::log1p(std::exp(-std::abs(xi)));
  });
  *k.out[0].data<float>() = static_cast<float>(total / static_cast<double>(n));
}

void infer_bwd(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.input(0).numel() == 1, "expected a scalar dloss");
  MINIDL_CHECK_NODE(c, c.input(1) == c.input(2), "expected logits and target of one shape");
  c.set_output(0, c.input(1));
}

// dloss [], x, target -> dx = (sigmoid(x) - target) dloss / n; dtarget = -x dloss / n
void bce_with_logits_bwd_native(const ir::KernelArgs& k) {
  const float* x = k.in[1].data<float>();
  const float* t = k.in[2].data<float>();
  float* dx = k.out[0].data<float>();
  const std::int64_t n = k.in[1].numel();
  const float scale = *k.in[0].data<float>() / static_cast<float>(n);
  elementwise(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) dx[i] = scale * (1.0f / (1.0f + std::exp(-x[i])) - t[i]);
  });
}

void grad(ir::GradCtx& g) {
  if (g.needs_input_grad(0))
    g.set_input_grad(0, g.op(op_bce_with_logits_bwd, {g.out_grad(0), g.input(0), g.input(1)}));
  if (g.needs_input_grad(1)) {
    // d/dt of the mean of (-x t) is -x / n.
    const double n = static_cast<double>(g.input(0)->shape().numel());
    ir::Value* dy = g.op(op_expand, {g.out_grad(0)},
                         {{"shape", g.input(0)->shape().dims()}, {"alpha", -1.0 / n}});
    g.set_input_grad(1, g.op(op_mul, {dy, g.input(0)}));
  }
}

}  // namespace

MINIDL_OP(bce_with_logits)
    .inputs({"logits", "target"})
    .outputs({"loss"})
    .infer(infer)
    .kernel(ir::Backend::Native, bce_with_logits_native)
    .grad(grad);

MINIDL_OP(bce_with_logits_bwd)
    .inputs({"dloss", "logits", "target"})
    .outputs({"dlogits"})
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, bce_with_logits_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
