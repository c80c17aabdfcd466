// bn_stats: the per-channel statistics of a batch, x [N,C] or [N,C,H,W] (channel = dimension 1)
// -> stats [3,C]: row 0 the number of elements per channel (N*H*W, as a float), row 1 their sum,
// row 2 their sum of squares. BatchNorm's training forward is split into bn_stats -> bn_moments
// -> batch_norm so that the statistics of every replica and rank can be summed in between
// (cross_replica_sum: counts, sums and sums of squares add up; means and variances do not).
// Accumulated in double in fixed chunks combined in order (ops/nn/channels.hpp), so the result
// does not depend on the thread count. Gradient: bn_stats_bwd(x, dstats) -> dx =
// dstats[1,c] + 2 x dstats[2,c] (the count does not depend on x).
//
// Both kernels read x (and write dx) in its layout, plain or channel-blocked, so a BatchNorm
// between oneDNN convolutions keeps their blocked activations.
#include <memory>

#include "minidl/ops/common.hpp"
#include "minidl/ops/nn/channels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const std::int64_t ch = check_activation(c, 0, "x");
  c.set_output(0, Shape{3, ch});
}

void infer_bwd(ir::InferCtx& c) {
  const std::int64_t ch = check_activation(c, 0, "x");
  MINIDL_CHECK_NODE(c, c.dtype(1) == DType::F32, "expected f32 dstats, got ", c.dtype(1));
  MINIDL_CHECK_NODE(c, c.input(1) == (Shape{3, ch}), "dstats must be [3,", ch, "] to match x");
  c.set_output(0, c.input(0));
}

/// One (n, channel block) group of a blocked layout of block B: count positions of B channels
/// side by side added to acc[ci * 2] (sum x) and acc[ci * 2 + 1] (sum x^2). The accumulators stay
/// in registers and each channel's additions keep their order (the vectorised clones differ from
/// the scalar loop only where they contract into an FMA).
template <int B>
__attribute__((target_clones("avx512f", "avx2", "default"))) void block_stats(const float* x,
                                                                              std::int64_t count,
                                                                              double* acc) {
  double s0[B], s1[B];
  for (int ci = 0; ci < B; ++ci) {
    s0[ci] = acc[ci * 2];
    s1[ci] = acc[ci * 2 + 1];
  }
  for (std::int64_t e = 0; e < count; ++e) {
    const float* v = x + e * B;
#pragma omp simd
    for (int ci = 0; ci < B; ++ci) {
      const double d = v[ci];
      s0[ci] += d;
      s1[ci] += d * d;
    }
  }
  for (int ci = 0; ci < B; ++ci) {
    acc[ci * 2] = s0[ci];
    acc[ci * 2 + 1] = s1[ci];
  }
}

/// A plain plane of n elements added to acc[0] (sum x) and acc[1] (sum x^2): kLanes interleaved
/// partial sums (element i into lane i % kLanes), then the lanes in order, a fixed order that
/// vectorises.
__attribute__((target_clones("avx512f", "avx2", "default"))) void plane_stats(const float* x,
                                                                              std::int64_t n,
                                                                              double* acc) {
  constexpr std::int64_t kLanes = 8;
  double s0[kLanes] = {}, s1[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (std::int64_t j = 0; j < kLanes; ++j) {
      const double d = x[i + j];
      s0[j] += d;
      s1[j] += d * d;
    }
  }
  for (std::int64_t j = 0; i + j < n; ++j) {
    const double d = x[i + j];
    s0[j] += d;
    s1[j] += d * d;
  }
  double t0 = 0.0, t1 = 0.0;
  for (std::int64_t j = 0; j < kLanes; ++j) {
    t0 += s0[j];
    t1 += s1[j];
  }
  acc[0] += t0;
  acc[1] += t1;
}

// src [N,C(,H,W)] -> stats [3,C]
ir::Kernel make_bn_stats(const ir::Node& node) {
  const ChannelGeom g = channel_geom(node.input(0));
  auto scratch = std::make_shared<std::vector<double>>();
  auto sums = std::make_shared<std::vector<double>>(2 * g.channels());
  return [g, scratch, sums](const ir::KernelArgs& k) {
    const float* x = k.in[0].data<float>();
    float* stats = k.out[0].data<float>();
    double* s = sums->data();
    if (g.B == 16 || g.B == 8 || g.B == 1) {
      // Blocked: a group's channels side by side; plain: a group is one channel's plane.
      const auto group = g.B == 16 ? block_stats<16> : g.B == 8 ? block_stats<8> : plane_stats;
      channel_block_sums<2>(g, *scratch, s, [=](std::int64_t n, std::int64_t cb, double* acc) {
        group(x + g.group(n, cb), g.S, acc);
      });
    } else {
      channel_sums<2>(g, *scratch, s, [x](std::int64_t e, std::int64_t, double* acc) {
        const double v = x[e];
        acc[0] += v;
        acc[1] += v * v;
      });
    }
    const std::int64_t ch = g.channels();
    for (std::int64_t c = 0; c < ch; ++c) {
      stats[c] = static_cast<float>(g.count());
      stats[ch + c] = static_cast<float>(s[c]);
      stats[2 * ch + c] = static_cast<float>(s[ch + c]);
    }
  };
}

// src [N,C(,H,W)], diff_stats [3,C] -> diff_src
void bn_stats_bwd_native(const ir::KernelArgs& k) {
  const ChannelGeom g = channel_geom(k.node->input(0));
  const std::int64_t ch = g.channels();
  const float* x = k.in[0].data<float>();
  const float* dsum = k.in[1].data<float>() + ch;
  const float* dsq = k.in[1].data<float>() + 2 * ch;
  float* dx = k.out[0].data<float>();
  for_each_element([=](std::int64_t c, std::int64_t ex,
                       std::int64_t edx) { dx[edx] = dsum[c] + 2.0f * x[ex] * dsq[c]; },
                   g, channel_geom(k.node->output(0)));
}

void grad(ir::GradCtx& g) {
  if (g.needs_input_grad(0))
    g.set_input_grad(0, g.op(op_bn_stats_bwd, {g.input(0), g.out_grad(0)}));
}

}  // namespace

MINIDL_OP(bn_stats)
    .inputs({"x"})
    .outputs({"stats"})
    .infer(infer)
    .kernel_factory(ir::Backend::Native, "native", make_bn_stats)
    .layout_aware()  // plain, or the blocked layouts of oneDNN's convolutions
    .grad(grad);

MINIDL_OP(bn_stats_bwd)
    .inputs({"x", "dstats"})
    .outputs({"dx"})
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, bn_stats_bwd_native)
    .layout_aware()
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
