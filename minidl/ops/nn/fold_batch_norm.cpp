// fold_batch_norm: the weights and bias of a convolution with an evaluation-mode BatchNorm folded
// in (ops::FoldBatchNorm). conv2d(x, w, b) followed by batch_norm(., mean, var, gamma, beta) is
// conv2d(x, w', b') with, per output channel k and s = gamma[k] / sqrt(var[k] + eps):
//   w'[k] = w[k] * s,   b'[k] = (b[k] - mean[k]) * s + beta[k]
// Computed by a node every run, since w, gamma and the statistics are bound storage that may
// change between runs. gamma and beta are optional (BatchNorm with affine=false).
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

// w [K,C,KH,KW], b [K], mean [K], var [K], gamma [K]?, beta [K]? -> w', b'
void infer(ir::InferCtx& c) {
  const Shape& w = c.input(0);
  MINIDL_CHECK_NODE(c, w.rank() == 4, "expected w [K,C,KH,KW], got rank ", w.rank());
  for (int i = 0; i < c.num_inputs(); ++i) {
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32, got ", c.dtype(i));
    if (i > 0) {
      MINIDL_CHECK_NODE(c, c.input(i) == Shape{w[0]}, "input ", i, " (",
                        c.node().def().input_names()[static_cast<std::size_t>(i)], ") must be [",
                        w[0], "], one per filter of w");
    }
  }
  const auto eps = c.attr<float>("eps");
  MINIDL_CHECK_NODE(c, eps >= 0.0f && std::isfinite(eps), "eps must be finite and >= 0, got ", eps);
  c.set_output(0, w);
  c.set_output(1, Shape{w[0]});
}

void fold_batch_norm_native(const ir::KernelArgs& k) {
  const std::int64_t oc = k.in[0].shape()[0], taps = k.in[0].numel() / oc;
  const float eps = k.attrs().get<float>("eps");
  const float* w = k.in[0].data<float>();
  const float* b = k.in[1].data<float>();
  const float* mean = k.in[2].data<float>();
  const float* var = k.in[3].data<float>();
  const float* gamma = k.in.size() > 4 ? k.in[4].data<float>() : nullptr;
  const float* beta = k.in.size() > 5 ? k.in[5].data<float>() : nullptr;
  float* wo = k.out[0].data<float>();
  float* bo = k.out[1].data<float>();
  for (std::int64_t kk = 0; kk < oc; ++kk) {
    const float s = (gamma ? gamma[kk] : 1.0f) / std::sqrt(var[kk] + eps);
    for (std::int64_t j = 0; j < taps; ++j) wo[kk * taps + j] = w[kk * taps + j] * s;
    bo[kk] = (b[kk] - mean[kk]) * s + (beta ? beta[kk] : 0.0f);
  }
}

}  // namespace

MINIDL_OP(fold_batch_norm)
    .inputs({"w", "b", "mean", "var", "gamma?", "beta?"})
    .outputs({"w_folded", "b_folded"})
    .attr<float>("eps", 1e-5f)
    .infer(infer)
    .kernel(ir::Backend::Native, fold_batch_norm_native)
    .no_grad("made by ops::FoldBatchNorm for evaluation graphs, which are not differentiated");

}  // namespace minidl::ops
