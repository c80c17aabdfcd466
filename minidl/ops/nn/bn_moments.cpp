// bn_moments: stats [3,C] (count, sum, sum of squares per channel, as bn_stats gives them) ->
// mean [C] = sum / n and the biased variance var [C] = sumsq / n - mean^2, computed in double
// and clamped at 0 (rounding can take it below). Gradient: bn_moments_bwd(stats, dmean, dvar)
// -> dstats [3,C], the exact partial derivatives of both outputs with respect to all three rows
// (bn_stats_bwd then ignores row 0: the count does not depend on x). Where the clamp holds the
// variance at 0, it has no gradient.
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

std::int64_t check_stats(ir::InferCtx& c, int i) {
  const Shape& s = c.input(i);
  MINIDL_CHECK_NODE(c, s.rank() == 2 && s[0] == 3, "expected stats [3,C], got ", s);
  MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "expected f32 stats, got ", c.dtype(i));
  return s[1];
}

void infer(ir::InferCtx& c) {
  const std::int64_t ch = check_stats(c, 0);
  c.set_output(0, Shape{ch});
  c.set_output(1, Shape{ch});
}

void infer_bwd(ir::InferCtx& c) {
  const std::int64_t ch = check_stats(c, 0);
  for (int i = 1; i < 3; ++i) {
    MINIDL_CHECK_NODE(c, c.input(i) == Shape{ch} && c.dtype(i) == DType::F32, "input ", i, " (",
                      i == 1 ? "dmean" : "dvar", ") must be f32 [", ch, "] to match stats");
  }
  c.set_output(0, c.input(0));
}

struct Moments {
  double n, sum, sumsq, mean, raw_var;
};
Moments moments(const float* stats, std::int64_t ch, std::int64_t c) {
  Moments m{stats[c], stats[ch + c], stats[2 * ch + c], 0.0, 0.0};
  m.mean = m.sum / m.n;
  m.raw_var = m.sumsq / m.n - m.mean * m.mean;
  return m;
}

// stats [3,C] -> mean [C], var [C]
void bn_moments_native(const ir::KernelArgs& k) {
  const std::int64_t ch = k.in[0].shape()[1];
  const float* stats = k.in[0].data<float>();
  float* mean = k.out[0].data<float>();
  float* var = k.out[1].data<float>();
  for (std::int64_t c = 0; c < ch; ++c) {
    const Moments m = moments(stats, ch, c);
    mean[c] = static_cast<float>(m.mean);
    var[c] = static_cast<float>(std::max(0.0, m.raw_var));
  }
}

// stats [3,C], dmean [C], dvar [C] -> dstats [3,C]. With mean = s / n, var = q / n - s^2 / n^2:
//   d/dn = -s / n^2 (mean), -q / n^2 + 2 s^2 / n^3 (var); d/ds = 1 / n, -2 s / n^2; d/dq = 0, 1 / n
void bn_moments_bwd_native(const ir::KernelArgs& k) {
  const std::int64_t ch = k.in[0].shape()[1];
  const float* stats = k.in[0].data<float>();
  const float* dmean = k.in[1].data<float>();
  const float* dvar = k.in[2].data<float>();
  float* ds = k.out[0].data<float>();
  for (std::int64_t c = 0; c < ch; ++c) {
    const Moments m = moments(stats, ch, c);
    const double dm = dmean[c];
    const double dv = m.raw_var > 0.0 ? double{dvar[c]} : 0.0;
    const double n2 = m.n * m.n;
    ds[c] =
        static_cast<float>(-dm * m.sum / n2 + dv * (-m.sumsq / n2 + 2.0 * m.mean * m.mean / m.n));
    ds[ch + c] = static_cast<float>(dm / m.n - dv * 2.0 * m.mean / m.n);
    ds[2 * ch + c] = static_cast<float>(dv / m.n);
  }
}

// A missing output gradient (the mean or the variance does not reach the loss) is zero.
void grad(ir::GradCtx& g) {
  if (!g.needs_input_grad(0)) return;
  const ir::Ints shape = g.output(0)->shape().dims();
  auto out_grad = [&](int i) {
    ir::Value* d = g.out_grad(i);
    return d != nullptr ? d : g.op(op_fill, {}, {{"shape", shape}, {"value", 0.0}});
  };
  g.set_input_grad(0, g.op(op_bn_moments_bwd, {g.input(0), out_grad(0), out_grad(1)}));
}

}  // namespace

MINIDL_OP(bn_moments)
    .inputs({"stats"})
    .outputs({"mean", "var"})
    .infer(infer)
    .kernel(ir::Backend::Native, bn_moments_native)
    .grad(grad);

MINIDL_OP(bn_moments_bwd)
    .inputs({"stats", "dmean", "dvar"})
    .outputs({"dstats"})
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, bn_moments_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
