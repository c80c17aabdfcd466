// softmax_cross_entropy: fused softmax and mean negative log-likelihood.
//   logits [N,C] f32, labels [N] i32 -> loss [] (mean over N), probs [N,C]
// Each row subtracts its maximum before exp and the loss uses log-sum-exp, so large logits
// neither overflow nor lose the loss. With label_smoothing e the target is (1 - e) onehot + e/C
// (torch.nn.CrossEntropyLoss(label_smoothing=e)): the row's loss is (1 - e)(-log p_y) +
// e mean_j(-log p_j). The backward is (probs - target) * dloss / N.
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  const Shape& y = c.input(1);
  MINIDL_CHECK_NODE(c, x.rank() == 2, "expected logits [N,C]");
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 logits");
  MINIDL_CHECK_NODE(c, y.rank() == 1 && y[0] == x[0], "expected labels [", x[0], "]");
  MINIDL_CHECK_NODE(c, c.dtype(1) == DType::I32, "expected i32 labels, got ", c.dtype(1));
  const double e = c.attr<double>("label_smoothing");
  MINIDL_CHECK_NODE(c, e >= 0.0 && e <= 1.0, "label_smoothing must lie in [0, 1], got ", e);
  c.set_output(0, Shape{});
  c.set_output(1, x);
}

void check_labels(const ir::KernelArgs& k, const std::int32_t* labels, std::int64_t n,
                  std::int64_t classes) {
  for (std::int64_t i = 0; i < n; ++i) {
    MINIDL_CHECK(labels[i] >= 0 && labels[i] < classes, k.node->describe(), ": label ", labels[i],
                 " of sample ", i, " is out of range [0, ", classes, ")");
  }
}

// loss [] from logits and labels: the mean in a fixed row order, so the loss does not depend on
// the thread count. -log p is log-sum-exp minus the label's logit, from the logits themselves
// (not from probs, which underflow), in double. Shared by every backend's kernel.
void mean_nll(const ir::KernelArgs& k) {
  const std::int64_t n = k.in[0].shape()[0], classes = k.in[0].shape()[1];
  const float* x = k.in[0].data<float>();
  const std::int32_t* labels = k.in[1].data<std::int32_t>();
  check_labels(k, labels, n, classes);
  const double e = k.attrs().get<double>("label_smoothing");
  double total = 0.0;
  for (std::int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * classes;
    float mx = xr[0];
    for (std::int64_t j = 1; j < classes; ++j) mx = std::max(mx, xr[j]);
    double s = 0.0, mean = 0.0;
    for (std::int64_t j = 0; j < classes; ++j) s += std::exp(static_cast<double>(xr[j] - mx));
    const double lse = std::log(s);
    const double nll = lse - static_cast<double>(xr[labels[r]] - mx);
    if (e == 0.0) {
      total += nll;
      continue;
    }
    for (std::int64_t j = 0; j < classes; ++j) mean += static_cast<double>(xr[j] - mx);
    mean /= static_cast<double>(classes);
    total += (1.0 - e) * nll + e * (lse - mean);
  }
  *k.out[0].data<float>() = static_cast<float>(total / static_cast<double>(n));
}

void softmax_cross_entropy_native(const ir::KernelArgs& k) {
  const std::int64_t n = k.in[0].shape()[0], classes = k.in[0].shape()[1];
  const float* x = k.in[0].data<float>();
  float* probs = k.out[1].data<float>();
  mean_nll(k);  // checks the labels first
  parallel_for(n, 4 * classes, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * classes;
      float* pr = probs + r * classes;
      float mx = xr[0];
      for (std::int64_t j = 1; j < classes; ++j) mx = std::max(mx, xr[j]);
      float s = 0.0f;
      for (std::int64_t j = 0; j < classes; ++j) s += (pr[j] = std::exp(xr[j] - mx));
      const float inv = 1.0f / s;
      for (std::int64_t j = 0; j < classes; ++j) pr[j] *= inv;
    }
  });
}

void infer_bwd(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.input(0).numel() == 1, "expected a scalar dloss");
  MINIDL_CHECK_NODE(c, c.input(1).rank() == 2, "expected probs [N,C]");
  MINIDL_CHECK_NODE(c, c.input(2).rank() == 1 && c.input(2)[0] == c.input(1)[0],
                    "expected labels [N]");
  c.set_output(0, c.input(1));
}

// dloss [], probs [N,C], labels [N] -> dlogits [N,C]
void softmax_cross_entropy_bwd_native(const ir::KernelArgs& k) {
  const std::int64_t n = k.in[1].shape()[0], classes = k.in[1].shape()[1];
  const float scale = *k.in[0].data<float>() / static_cast<float>(n);
  const float* p = k.in[1].data<float>();
  const std::int32_t* labels = k.in[2].data<std::int32_t>();
  float* dx = k.out[0].data<float>();
  check_labels(k, labels, n, classes);
  const double e = k.attrs().get<double>("label_smoothing");
  const auto off = static_cast<float>(e / static_cast<double>(classes));
  const auto on = static_cast<float>(1.0 - e) + off;
  parallel_for(n, classes, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t j = 0; j < classes; ++j)
        dx[r * classes + j] = (p[r * classes + j] - off) * scale;
      dx[r * classes + labels[r]] -= (on - off) * scale;
    }
  });
}

void grad(ir::GradCtx& g) {
  if (g.out_grad(1) != nullptr) {
    MINIDL_FAIL(g.node().describe(), ": the probs output cannot be differentiated; use the loss");
  }
  g.set_input_grad(0, g.op(op_softmax_cross_entropy_bwd, {g.out_grad(0), g.output(1), g.input(1)},
                           {{"label_smoothing", g.attrs().get<double>("label_smoothing")}}));
}

}  // namespace

MINIDL_OP(softmax_cross_entropy)
    .inputs({"logits", "labels"})
    .outputs({"loss", "probs"})
    .attr<double>("label_smoothing", 0.0)
    .infer(infer)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::softmax_cross_entropy_kernel(mean_nll),
                    onednn::softmax_cross_entropy_supports)
#endif
    .kernel(ir::Backend::Native, softmax_cross_entropy_native)
    .grad(grad);

MINIDL_OP(softmax_cross_entropy_bwd)
    .inputs({"dloss", "probs", "labels"})
    .outputs({"dlogits"})
    .attr<double>("label_smoothing", 0.0)
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, softmax_cross_entropy_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
