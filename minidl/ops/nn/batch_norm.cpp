// batch_norm: y = (x - mean[c]) / sqrt(var[c] + eps) * weight[c] + bias[c] over x [N,C] or
// [N,C,H,W] (channel = dimension 1); weight and bias are optional (BatchNorm with affine=false).
// mean and var are inputs: bn_moments' outputs in training (the batch statistics), the running
// statistics in evaluation. An optional last input `residual` (shaped like x; weight and bias
// present) is added to the normalised value before the activation: ops::FuseResidualIntoBatchNorm
// folds a residual block's add(batch_norm(...), shortcut) into the node, so the normalised tensor
// is never written and read back; its gradient is the (masked) dy.
//
// One backward op: batch_norm_bwd(dy, x, mean, var, weight?) -> dx, dweight, dbias, dmean, dvar,
// where dx holds mean and var constant (dx = dy * w * invstd), dweight = sum dy * xhat, dbias =
// sum dy, and dmean, dvar are the exact partial derivatives, in O(C) from the latter two:
//   dy/dmean = -w invstd            -> dmean = -w invstd dbias
//   dy/dvar  = -1/2 w invstd^3 (x - mean) = -1/2 w invstd^2 xhat  -> dvar = -1/2 w invstd^2 dweight
// With mean and var from bn_moments(bn_stats(x)), autograd adds the paths through
// bn_moments_bwd and bn_stats_bwd, which together give PyTorch's BatchNorm gradient.
//
// After autograd, ops::FuseBatchNormBackward splits that composition differently: the add of
// batch_norm_bwd's dx and bn_stats_bwd's becomes batch_norm_bwd_data (one pass writing dx), and
// batch_norm_bwd becomes batch_norm_bwd_reduce (the per-channel outputs only, summed in double in
// an order independent of the thread count):
//   batch_norm_bwd_reduce(dy, x, mean, var, weight?) -> dweight, dbias, dmean, dvar
//   batch_norm_bwd_data(dy, x, var, dstats, weight?) -> dx = dy w invstd + dstats[1,c]
//                                                           + 2 x dstats[2,c]
//
// A ReLU after the normalisation fuses in both directions (the `activation` attribute, as on
// conv2d and matmul): batch_norm with activation=relu gives max(y, 0) in the same pass
// (ops::FuseBiasActivation), and the two fused backward ops with activation=relu read the ReLU's
// output y as a last input and mask their dy with it, dy_eff = (y > 0 ? dy : 0), in place of a
// relu_bwd node (ops::FuseActivationBackward). y is any value whose positive entries mark where
// the ReLU passed its input: this BatchNorm's fused output, or a later residual sum's.
// The masked kernels give the bits of relu_bwd followed by the unmasked ones, except that a
// masked entry is +0 where oneDNN's relu_bwd gives dy * 0 (-0 for a negative dy); sums and
// products treat both alike.
//
// The native kernels and oneDNN's (batch_normalization_forward / _backward with
// use_global_stats) read and write every activation (x, y, dy, dx) in its layout, plain or
// channel-blocked, so a BatchNorm between convolutions keeps their blocked layout.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>

#include "minidl/ops/common.hpp"
#include "minidl/ops/nn/channels.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

/// Inputs from `first` on are per-channel [C] f32 vectors named by `names`.
void check_channel_vectors(ir::InferCtx& c, int first, std::int64_t ch,
                           std::initializer_list<const char*> names) {
  int i = first;
  for (const char* name : names) {
    if (i >= c.num_inputs()) return;
    MINIDL_CHECK_NODE(c, c.input(i) == Shape{ch}, name, " must be [", ch,
                      "] (one per channel of x), got ", c.input(i));
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "expected f32 ", name, ", got ", c.dtype(i));
    ++i;
  }
}

float check_eps(ir::InferCtx& c) {
  const auto eps = c.attr<float>("eps");
  MINIDL_CHECK_NODE(c, eps >= 0.0f && std::isfinite(eps), "eps must be finite and >= 0, got ", eps);
  return eps;
}

/// The `activation` attribute of a fused backward op and its optional input y (index y_index):
/// y is there exactly when the activation is relu, shaped like dy.
void check_mask(ir::InferCtx& c, int y_index) {
  const bool relu = activation_attr(c) == Activation::Relu;
  const bool has_y = c.num_inputs() > y_index;
  MINIDL_CHECK_NODE(c, !relu || has_y, "activation relu needs the ReLU's output y as input ",
                    y_index);
  MINIDL_CHECK_NODE(c, relu || !has_y, "input y (", y_index,
                    ") masks dy only with activation relu, got activation none");
  if (!has_y) return;
  MINIDL_CHECK_NODE(c, c.dtype(y_index) == DType::F32, "expected f32 y, got ", c.dtype(y_index));
  MINIDL_CHECK_NODE(c, c.input(y_index) == c.input(0), "y ", c.input(y_index), " and dy ",
                    c.input(0), " must have one shape");
}

// x [N,C(,H,W)], mean [C], var [C], weight [C]?, bias [C]?, residual (x's shape)? -> y
void infer(ir::InferCtx& c) {
  const std::int64_t ch = check_activation(c, 0, "x");
  check_channel_vectors(c, 1, ch, {"mean", "var", "weight", "bias"});
  if (c.num_inputs() > 5) {
    MINIDL_CHECK_NODE(c, c.dtype(5) == DType::F32, "expected an f32 residual, got ", c.dtype(5));
    MINIDL_CHECK_NODE(c, c.input(5) == c.input(0), "residual ", c.input(5), " and x ", c.input(0),
                      " must have one shape");
  }
  check_eps(c);
  activation_attr(c);
  c.set_output(0, c.input(0));
}

// dy, x, mean, var, weight? -> dx, dweight, dbias, dmean, dvar
void infer_bwd(ir::InferCtx& c) {
  const std::int64_t ch = check_activation(c, 0, "dy");
  check_activation(c, 1, "x");
  MINIDL_CHECK_NODE(c, c.input(0) == c.input(1), "dy ", c.input(0), " and x ", c.input(1),
                    " must have one shape");
  check_channel_vectors(c, 2, ch, {"mean", "var", "weight"});
  check_eps(c);
  c.set_output(0, c.input(1));
  for (int o = 1; o < 5; ++o) c.set_output(o, Shape{ch});
}

// dy, x, mean, var, weight? -> dweight, dbias, dmean, dvar
void infer_bwd_reduce(ir::InferCtx& c) {
  const std::int64_t ch = check_activation(c, 0, "dy");
  check_activation(c, 1, "x");
  MINIDL_CHECK_NODE(c, c.input(0) == c.input(1), "dy ", c.input(0), " and x ", c.input(1),
                    " must have one shape");
  check_channel_vectors(c, 2, ch, {"mean", "var", "weight"});
  check_eps(c);
  check_mask(c, 5);
  for (int o = 0; o < 4; ++o) c.set_output(o, Shape{ch});
}

// dy, x, var, dstats, weight? -> dx
void infer_bwd_data(ir::InferCtx& c) {
  const std::int64_t ch = check_activation(c, 0, "dy");
  check_activation(c, 1, "x");
  MINIDL_CHECK_NODE(c, c.input(0) == c.input(1), "dy ", c.input(0), " and x ", c.input(1),
                    " must have one shape");
  check_channel_vectors(c, 2, ch, {"var"});
  MINIDL_CHECK_NODE(c, c.dtype(3) == DType::F32, "expected f32 dstats, got ", c.dtype(3));
  MINIDL_CHECK_NODE(c, c.input(3) == (Shape{3, ch}), "dstats must be [3,", ch, "] to match x, got ",
                    c.input(3));
  check_channel_vectors(c, 4, ch, {"weight"});
  check_eps(c);
  check_mask(c, 5);
  c.set_output(0, c.input(1));
}

/// 1 / sqrt(var + eps) in float, as oneDNN computes it.
inline float inv_std(float var, float eps) { return 1.0f / std::sqrt(var + eps); }

/// max(v, 0) with relu's own comparison, so a fused node has the bits of relu after it.
template <bool Relu>
inline float activate(float v) {
  if constexpr (Relu) return v > 0.0f ? v : 0.0f;
  return v;
}

/// y = act((x - mean) a + b) (b may be null), each value in its layout.
template <bool Relu>
void normalize(const ChannelGeom& gx, const ChannelGeom& gy, const float* x, const float* mean,
               const float* a, const float* b, float* y) {
  if (b != nullptr) {
    for_each_element(
        [=](std::int64_t c, std::int64_t ex, std::int64_t ey) {
          y[ey] = activate<Relu>((x[ex] - mean[c]) * a[c] + b[c]);
        },
        gx, gy);
  } else {
    for_each_element([=](std::int64_t c, std::int64_t ex,
                         std::int64_t ey) { y[ey] = activate<Relu>((x[ex] - mean[c]) * a[c]); },
                     gx, gy);
  }
}

/// y = act(((x - mean) a + b) + r), each value in its layout: the normalised value is rounded to
/// float before the sum, so the bits are those of batch_norm followed by add.
template <bool Relu>
void normalize_add(const ChannelGeom& gx, const ChannelGeom& gr, const ChannelGeom& gy,
                   const float* x, const float* mean, const float* a, const float* b,
                   const float* r, float* y) {
  for_each_element(
      [=](std::int64_t c, std::int64_t ex, std::int64_t er, std::int64_t ey) {
        const float t = (x[ex] - mean[c]) * a[c] + b[c];
        y[ey] = activate<Relu>(t + r[er]);
      },
      gx, gr, gy);
}

// src, mean, variance, scale?, shift?, residual? -> dst
ir::Kernel make_batch_norm(const ir::Node& node) {
  const ChannelGeom gx = channel_geom(node.input(0)), gy = channel_geom(node.output(0));
  const std::int64_t ch = gx.channels();
  const bool has_w = node.inputs().size() > 3, has_b = node.inputs().size() > 4;
  const bool has_r = node.inputs().size() > 5;
  const ChannelGeom gr = has_r ? channel_geom(node.input(5)) : gx;
  const bool relu = activation_of(node.attrs()) == Activation::Relu;
  auto scale = std::make_shared<std::vector<float>>(ch);
  return [gx, gr, gy, ch, has_w, has_b, has_r, relu, scale](const ir::KernelArgs& k) {
    const float eps = k.attrs().get<float>("eps");
    const float* x = k.in[0].data<float>();
    const float* mean = k.in[1].data<float>();
    const float* var = k.in[2].data<float>();
    const float* w = has_w ? k.in[3].data<float>() : nullptr;
    const float* b = has_b ? k.in[4].data<float>() : nullptr;
    float* y = k.out[0].data<float>();
    float* a = scale->data();
    for (std::int64_t c = 0; c < ch; ++c) a[c] = inv_std(var[c], eps) * (w ? w[c] : 1.0f);
    if (has_r) {
      const float* r = k.in[5].data<float>();
      if (relu) {
        normalize_add<true>(gx, gr, gy, x, mean, a, b, r, y);
      } else {
        normalize_add<false>(gx, gr, gy, x, mean, a, b, r, y);
      }
      return;
    }
    if (relu) {
      normalize<true>(gx, gy, x, mean, a, b, y);
    } else {
      normalize<false>(gx, gy, x, mean, a, b, y);
    }
  };
}

/// dmean and dvar from dweight and dbias, per channel.
void mean_var_grads(std::int64_t ch, float eps, const float* var, const float* w,
                    const float* dweight, const float* dbias, float* dmean, float* dvar) {
  for (std::int64_t c = 0; c < ch; ++c) {
    const float is = inv_std(var[c], eps), wc = w ? w[c] : 1.0f;
    dmean[c] = -wc * is * dbias[c];
    dvar[c] = -0.5f * wc * is * is * dweight[c];
  }
}

/// dmean and dvar from dweight, dbias (outputs 1..4 of a batch_norm_bwd kernel).
void batch_norm_mean_var_grads(const ir::KernelArgs& k) {
  mean_var_grads(k.out[1].numel(), k.attrs().get<float>("eps"), k.in[3].data<float>(),
                 k.in.size() > 4 ? k.in[4].data<float>() : nullptr, k.out[1].data<float>(),
                 k.out[2].data<float>(), k.out[3].data<float>(), k.out[4].data<float>());
}

/// dy masked by the ReLU's output y (Mask), or dy itself.
template <bool Mask>
[[gnu::always_inline]] inline float masked(float dy, const float* y, std::int64_t ey) {
  if constexpr (Mask) {
    // Branch-free (dy's bits, or +0), so that the loops summing it vectorise.
    const std::uint32_t keep = y[ey] > 0.0f ? 0xffffffffu : 0u;
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(dy) & keep);
  }
  return dy;
}

/// One (n, channel block) group of bwd_sums in a blocked layout of block B: count positions of
/// B channels side by side, added to acc[ci * 2] (sum dy) and acc[ci * 2 + 1] (sum dy (x - mean)),
/// dy masked by y (same layout) when Mask. The accumulators stay in registers, and each channel's
/// additions keep their order, so the vectorised clones differ from the scalar loop only where
/// they contract into an FMA. Always inlined: GCC left the masked 16-channel body out of line,
/// compiled for the baseline, so its clones were a jump to SSE2 code.
template <int B, bool Mask>
[[gnu::always_inline]] inline void block_bwd_sums(const float* dy, const float* x, const float* y,
                                                  const float* mean, std::int64_t count,
                                                  double* acc) {
  double s0[B], s1[B], m[B];
  for (int ci = 0; ci < B; ++ci) {
    s0[ci] = acc[ci * 2];
    s1[ci] = acc[ci * 2 + 1];
    m[ci] = mean[ci];
  }
  for (std::int64_t e = 0; e < count; ++e) {
    const float* d = dy + e * B;
    const float* v = x + e * B;
#pragma omp simd
    for (int ci = 0; ci < B; ++ci) {
      const double dd = masked<Mask>(d[ci], y, e * B + ci);
      s0[ci] += dd;
      s1[ci] += dd * (double{v[ci]} - m[ci]);
    }
  }
  for (int ci = 0; ci < B; ++ci) {
    acc[ci * 2] = s0[ci];
    acc[ci * 2 + 1] = s1[ci];
  }
}

using BlockSums = void (*)(const float*, const float*, const float*, const float*, std::int64_t,
                           double*);

__attribute__((target_clones("avx512f", "avx2", "default"))) void block16_bwd_sums(
    const float* dy, const float* x, const float* y, const float* mean, std::int64_t count,
    double* acc) {
  block_bwd_sums<16, false>(dy, x, y, mean, count, acc);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void block8_bwd_sums(
    const float* dy, const float* x, const float* y, const float* mean, std::int64_t count,
    double* acc) {
  block_bwd_sums<8, false>(dy, x, y, mean, count, acc);
}

// The masked sums have no AVX-512 clone: GCC turns the mask into a load of dy masked by the
// compare of y (vmovdqu32 {k}{z}), which waits for y, and on an AMD EPYC (Zen 5, 2 threads, 8 MB
// activations from memory, a standalone loop) that ran 549-742 us against AVX2's 424-531 and the
// baseline's 566-729 (the unmasked sums: AVX-512 271-289, AVX2 438-537).
__attribute__((target_clones("avx2", "default"))) void block16_masked_bwd_sums(
    const float* dy, const float* x, const float* y, const float* mean, std::int64_t count,
    double* acc) {
  block_bwd_sums<16, true>(dy, x, y, mean, count, acc);
}

__attribute__((target_clones("avx2", "default"))) void block8_masked_bwd_sums(
    const float* dy, const float* x, const float* y, const float* mean, std::int64_t count,
    double* acc) {
  block_bwd_sums<8, true>(dy, x, y, mean, count, acc);
}

/// s[c] = sum dy and s[C + c] = sum dy (x - mean), per channel, in double and in an order that
/// does not depend on the threads; dy is masked by y (input 5, geometry gy) when the node has
/// it. dy, x and y usually share a layout; where they do not, they are copied to plain first.
void bwd_sums(const ir::KernelArgs& k, const ChannelGeom& gdy, const ChannelGeom& gx,
              const ChannelGeom& gy, std::vector<double>& scratch, double* s) {
  const float* dy = k.in[0].data<float>();
  const float* x = k.in[1].data<float>();
  const float* mean = k.in[2].data<float>();
  const float* y = k.in.size() > 5 ? k.in[5].data<float>() : nullptr;
  if (gdy == gx && (y == nullptr || gy == gx) && (gx.B == 16 || gx.B == 8)) {
    const ChannelGeom g = gx;
    BlockSums sums = y != nullptr ? (g.B == 16 ? block16_masked_bwd_sums : block8_masked_bwd_sums)
                                  : (g.B == 16 ? block16_bwd_sums : block8_bwd_sums);
    channel_block_sums<2>(g, scratch, s, [=](std::int64_t n, std::int64_t cb, double* acc) {
      const std::int64_t base = g.group(n, cb);
      sums(dy + base, x + base, y == nullptr ? nullptr : y + base, mean + cb * g.B, g.S, acc);
    });
    return;
  }
  if (gdy == gx && y == nullptr) {
    channel_sums<2>(gx, scratch, s, [=](std::int64_t e, std::int64_t c, double* acc) {
      const double d = dy[e];
      acc[0] += d;
      acc[1] += d * (double{x[e]} - mean[c]);
    });
    return;
  }
  if (gdy == gx && gy == gx) {
    channel_sums<2>(gx, scratch, s, [=](std::int64_t e, std::int64_t c, double* acc) {
      const double d = y[e] > 0.0f ? dy[e] : 0.0f;
      acc[0] += d;
      acc[1] += d * (double{x[e]} - mean[c]);
    });
    return;
  }
  const Tensor plain = Tensor::empty(k.in[0].shape());
  float* p = plain.data<float>();
  const ChannelGeom gp = channel_geom_plain(k.in[0].shape());
  if (y != nullptr) {
    for_each_element([=](std::int64_t, std::int64_t ep, std::int64_t ed,
                         std::int64_t ey) { p[ep] = y[ey] > 0.0f ? dy[ed] : 0.0f; },
                     gp, gdy, gy);
  } else {
    for_each_element([=](std::int64_t, std::int64_t ep, std::int64_t ed) { p[ep] = dy[ed]; }, gp,
                     gdy);
  }
  const Tensor xp = Tensor::empty(k.in[1].shape());
  float* q = xp.data<float>();
  for_each_element([=](std::int64_t, std::int64_t ep, std::int64_t ex) { q[ep] = x[ex]; }, gp, gx);
  channel_sums<2>(gp, scratch, s, [=](std::int64_t e, std::int64_t c, double* acc) {
    const double d = p[e];
    acc[0] += d;
    acc[1] += d * (double{q[e]} - mean[c]);
  });
}

/// The geometry of the mask y (input 5) of a fused backward node, or gx's when it has none.
ChannelGeom mask_geom(const ir::Node& node, const ChannelGeom& gx) {
  return node.inputs().size() > 5 ? channel_geom(node.input(5)) : gx;
}

// diff_dst, src, mean, variance, scale? -> diff_src, diff_scale, diff_shift, dmean, dvar
ir::Kernel make_batch_norm_bwd(const ir::Node& node) {
  const ChannelGeom gdy = channel_geom(node.input(0)), gx = channel_geom(node.input(1));
  const ChannelGeom gdx = channel_geom(node.output(0));
  const std::int64_t ch = gx.channels();
  const bool has_w = node.inputs().size() > 4;
  auto scratch = std::make_shared<std::vector<double>>();
  auto sums = std::make_shared<std::vector<double>>(2 * ch);
  auto scale = std::make_shared<std::vector<float>>(ch);
  return [gdy, gx, gdx, ch, has_w, scratch, sums, scale](const ir::KernelArgs& k) {
    const float eps = k.attrs().get<float>("eps");
    const float* dy = k.in[0].data<float>();
    const float* var = k.in[3].data<float>();
    const float* w = has_w ? k.in[4].data<float>() : nullptr;
    float* dx = k.out[0].data<float>();
    float* dweight = k.out[1].data<float>();
    float* dbias = k.out[2].data<float>();
    double* s = sums->data();
    bwd_sums(k, gdy, gx, gx, *scratch, s);
    float* a = scale->data();
    for (std::int64_t c = 0; c < ch; ++c) {
      const float is = inv_std(var[c], eps);
      a[c] = is * (w ? w[c] : 1.0f);
      dbias[c] = static_cast<float>(s[c]);
      dweight[c] = static_cast<float>(s[ch + c] * is);
    }
    for_each_element(
        [=](std::int64_t c, std::int64_t edx, std::int64_t edy) { dx[edx] = dy[edy] * a[c]; }, gdx,
        gdy);
    batch_norm_mean_var_grads(k);
  };
}

// diff_dst, src, mean, variance, scale? -> diff_scale, diff_shift, dmean, dvar
ir::Kernel make_batch_norm_bwd_reduce(const ir::Node& node) {
  const ChannelGeom gdy = channel_geom(node.input(0)), gx = channel_geom(node.input(1));
  const ChannelGeom gy = mask_geom(node, gx);
  const std::int64_t ch = gx.channels();
  const bool has_w = node.inputs().size() > 4;
  auto scratch = std::make_shared<std::vector<double>>();
  auto sums = std::make_shared<std::vector<double>>(2 * ch);
  return [gdy, gx, gy, ch, has_w, scratch, sums](const ir::KernelArgs& k) {
    const float eps = k.attrs().get<float>("eps");
    const float* var = k.in[3].data<float>();
    const float* w = has_w ? k.in[4].data<float>() : nullptr;
    float* dweight = k.out[0].data<float>();
    float* dbias = k.out[1].data<float>();
    double* s = sums->data();
    bwd_sums(k, gdy, gx, gy, *scratch, s);
    for (std::int64_t c = 0; c < ch; ++c) {
      dbias[c] = static_cast<float>(s[c]);
      dweight[c] = static_cast<float>(s[ch + c] * inv_std(var[c], eps));
    }
    mean_var_grads(ch, eps, var, w, dweight, dbias, k.out[2].data<float>(), k.out[3].data<float>());
  };
}

// diff_dst, src, variance, diff_stats [3,C], scale?, y? -> diff_src
ir::Kernel make_batch_norm_bwd_data(const ir::Node& node) {
  const ChannelGeom gdy = channel_geom(node.input(0)), gx = channel_geom(node.input(1));
  const ChannelGeom gdx = channel_geom(node.output(0)), gy = mask_geom(node, gx);
  const std::int64_t ch = gx.channels();
  const bool has_w = node.inputs().size() > 4, has_y = node.inputs().size() > 5;
  auto scale = std::make_shared<std::vector<float>>(ch);
  return [gdy, gx, gdx, gy, ch, has_w, has_y, scale](const ir::KernelArgs& k) {
    const float eps = k.attrs().get<float>("eps");
    const float* dy = k.in[0].data<float>();
    const float* x = k.in[1].data<float>();
    const float* var = k.in[2].data<float>();
    const float* dsum = k.in[3].data<float>() + ch;
    const float* dsq = k.in[3].data<float>() + 2 * ch;
    const float* w = has_w ? k.in[4].data<float>() : nullptr;
    float* dx = k.out[0].data<float>();
    float* a = scale->data();
    for (std::int64_t c = 0; c < ch; ++c) a[c] = inv_std(var[c], eps) * (w ? w[c] : 1.0f);
    // The unfused graph's roundings: dy a and dsum + 2 x dsq in f32, then their sum.
    if (has_y) {
      const float* y = k.in[5].data<float>();
      for_each_element(
          [=](std::int64_t c, std::int64_t edx, std::int64_t edy, std::int64_t ex,
              std::int64_t ey) {
            const float direct = masked<true>(dy[edy], y, ey) * a[c];
            const float through_stats = dsum[c] + 2.0f * x[ex] * dsq[c];
            dx[edx] = direct + through_stats;
          },
          gdx, gdy, gx, gy);
      return;
    }
    for_each_element(
        [=](std::int64_t c, std::int64_t edx, std::int64_t edy, std::int64_t ex) {
          const float direct = dy[edy] * a[c];
          const float through_stats = dsum[c] + 2.0f * x[ex] * dsq[c];
          dx[edx] = direct + through_stats;
        },
        gdx, gdy, gx);
  };
}

// With activation relu: dy = relu_bwd(dy, y) first (a fused node is made after autograd, but a
// graph may be built with one).
void grad(ir::GradCtx& g) {
  ir::Value* dy = g.out_grad(0);
  if (activation_of(g.attrs()) == Activation::Relu) dy = g.op(op_relu_bwd, {dy, g.output(0)});
  std::vector<ir::Value*> in{dy, g.input(0), g.input(1), g.input(2)};
  if (g.num_inputs() > 3) in.push_back(g.input(3));
  ir::Node* bwd =
      g.op(op_batch_norm_bwd, in, {{"eps", double{g.attrs().get<float>("eps")}}})->producer();
  // dx, then mean, var, weight, bias from dmean, dvar, dweight, dbias.
  const int from[] = {0, 3, 4, 1, 2};
  for (int i = 0; i < std::min(g.num_inputs(), 5); ++i)
    if (g.needs_input_grad(i)) g.set_input_grad(i, bwd->output(from[i]));
  // The residual is added after the normalisation: its gradient is dy (masked by the ReLU).
  if (g.num_inputs() > 5 && g.needs_input_grad(5)) g.set_input_grad(5, dy);
}

}  // namespace

MINIDL_OP(batch_norm)
    .inputs({"x", "mean", "var", "weight?", "bias?", "residual?"})
    .attr<float>("eps", 1e-5f)
    .attr<std::string>("activation", "none")
    .infer(infer)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::batch_norm_kernel,
                    onednn::batch_norm_supports)
    .layout_aware()
#endif
    .kernel_factory(ir::Backend::Native, "native", make_batch_norm)
    .layout_aware()  // plain, or the blocked layouts of oneDNN's convolutions
    .grad(grad);

MINIDL_OP(batch_norm_bwd)
    .inputs({"dy", "x", "mean", "var", "weight?"})
    .outputs({"dx", "dweight", "dbias", "dmean", "dvar"})
    .attr<float>("eps", 1e-5f)
    .infer(infer_bwd)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn",
                    onednn::batch_norm_bwd_kernel(batch_norm_mean_var_grads),
                    onednn::batch_norm_bwd_supports)
    .layout_aware()
#endif
    .kernel_factory(ir::Backend::Native, "native", make_batch_norm_bwd)
    .layout_aware()
    .no_grad("backward-only op; second derivatives are not supported");

MINIDL_OP(batch_norm_bwd_reduce)
    .inputs({"dy", "x", "mean", "var", "weight?", "y?"})
    .outputs({"dweight", "dbias", "dmean", "dvar"})
    .attr<float>("eps", 1e-5f)
    .attr<std::string>("activation", "none")
    .infer(infer_bwd_reduce)
    .kernel_factory(ir::Backend::Native, "native", make_batch_norm_bwd_reduce)
    .layout_aware()
    .no_grad("backward-only op; second derivatives are not supported");

MINIDL_OP(batch_norm_bwd_data)
    .inputs({"dy", "x", "var", "dstats", "weight?", "y?"})
    .outputs({"dx"})
    .attr<float>("eps", 1e-5f)
    .attr<std::string>("activation", "none")
    .infer(infer_bwd_data)
    .kernel_factory(ir::Backend::Native, "native", make_batch_norm_bwd_data)
    .layout_aware()
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
