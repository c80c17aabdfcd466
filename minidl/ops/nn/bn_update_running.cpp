// bn_update_running: BatchNorm's running statistics, updated in place from a batch's stats
// [3,C] (bn_stats' count, sum and sum of squares, summed over every replica and rank by
// cross_replica_sum), as PyTorch's BatchNorm does in training mode:
//   mean_b = sum / n,  var_b = (sumsq / n - mean_b^2) * n / (n - 1)   (unbiased; n = count)
//   running_mean = (1 - m) running_mean + m mean_b
//   running_var  = (1 - m) running_var  + m var_b
//   num_batches_tracked += 1
// with m the attribute `momentum`, computed in double. PyTorch refuses to train on one value per
// channel; here n = 1 takes the biased variance (0) instead of dividing by zero. A side effect on
// the module's buffers (state nodes), with no gradient.
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const Shape& stats = c.input(3);
  MINIDL_CHECK_NODE(c, stats.rank() == 2 && stats[0] == 3 && c.dtype(3) == DType::F32,
                    "expected f32 stats [3,C], got ", stats, " ", c.dtype(3));
  const std::int64_t ch = stats[1];
  for (int i = 0; i < 2; ++i) {
    MINIDL_CHECK_NODE(c, c.input(i) == Shape{ch} && c.dtype(i) == DType::F32, "input ", i, " (",
                      i == 0 ? "running_mean" : "running_var", ") must be f32 [", ch,
                      "] to match stats, got ", c.input(i), " ", c.dtype(i));
  }
  MINIDL_CHECK_NODE(c, c.input(2).rank() == 0 && c.dtype(2) == DType::I64,
                    "num_batches_tracked must be an i64 scalar [], got ", c.input(2), " ",
                    c.dtype(2));
  const auto m = c.attr<float>("momentum");
  MINIDL_CHECK_NODE(c, m >= 0.0f && m <= 1.0f, "momentum must be in [0, 1], got ", m);
  c.set_output(0, c.input(0));
  c.set_output(1, c.input(1));
  c.set_output(2, c.input(2), DType::I64);
}

// running_mean [C], running_var [C], num_batches_tracked [], stats [3,C] -> the first three
void bn_update_running_native(const ir::KernelArgs& k) {
  float* rmean = k.in[0].data<float>();
  float* rvar = k.in[1].data<float>();
  std::int64_t* tracked = k.in[2].data<std::int64_t>();
  const float* stats = k.in[3].data<float>();
  const std::int64_t ch = k.in[3].shape()[1];
  const double m = k.attrs().get<float>("momentum");
  for (std::int64_t c = 0; c < ch; ++c) {
    const double n = stats[c], mean = stats[ch + c] / n;
    const double var = std::max(0.0, stats[2 * ch + c] / n - mean * mean);
    const double unbiased = n > 1.0 ? var * n / (n - 1.0) : var;
    rmean[c] = static_cast<float>((1.0 - m) * rmean[c] + m * mean);
    rvar[c] = static_cast<float>((1.0 - m) * rvar[c] + m * unbiased);
  }
  *tracked += 1;
}

}  // namespace

MINIDL_OP(bn_update_running)
    .inputs({"running_mean", "running_var", "num_batches_tracked", "stats"})
    .outputs({"running_mean_out", "running_var_out", "num_batches_tracked_out"})
    .attr<float>("momentum", 0.1f)
    .infer(infer)
    .kernel(ir::Backend::Native, bn_update_running_native)
    .inplace(0, 0)
    .inplace(1, 1)
    .inplace(2, 2)
    .side_effect()
    .no_grad("updates BatchNorm's running statistics, a side effect on module buffers");

}  // namespace minidl::ops
