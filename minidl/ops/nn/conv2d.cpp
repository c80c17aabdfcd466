// conv2d: y[N,K,OH,OW] = act(x[N,C,H,W] (*) w[K,C,KH,KW] + bias), the cross-correlation
// PyTorch's Conv2d computes, with zero padding `pad` and `stride`. The bias [K] is optional and
// the activation (attribute `activation`: none or relu) none by default: models add a bias_add
// node, and the fusion pass folds it and a following relu into the convolution (native: applied
// to each sample's output while it is in cache; oneDNN: the primitive's bias and a post-op).
// The gradient rule turns dy into dz = relu_bwd(dy, y) and the bias gradient first; then the
// convolution and both halves of its backward are plain GEMMs around im2col / col2im:
//   forward                       y[n]  = w[K, C*KH*KW] * im2col(x[n])
//   conv2d_bwd_data(dy, w)    ->  dx[n] = col2im(w^T * dy[n])
//   conv2d_bwd_weights(dy, x) ->  dw    = sum_n dy[n] * im2col(x[n])^T
// Samples are spread over the OpenMP threads, each running a serial GEMM on its own column
// buffer; with fewer samples than threads the GEMM and im2col are parallel instead. A layer with
// few input channels (a first layer: C*KH*KW of 9 or 27 is a tiny inner dimension for a GEMM)
// runs the forward and the weight gradient as direct convolutions instead, without a column
// matrix (native/direct_conv.hpp), where the CPU has AVX-512. 3x3 convolutions between 16
// channels whose values lie channels-innermost run the 16-channel kernels (native/conv16.hpp),
// preferred over oneDNN's.
#include <algorithm>
#include <exception>
#include <memory>

#include "minidl/core/threading.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/native/amx_bf16.hpp"
#include "minidl/ops/native/conv16.hpp"
#include "minidl/ops/native/conv_amx.hpp"
#include "minidl/ops/native/conv_bf16.hpp"
#include "minidl/ops/native/direct_conv.hpp"
#include "minidl/ops/native/gemm.hpp"
#include "minidl/ops/native/im2col.hpp"
#include "minidl/ops/nn/max_pool2d_lanes.hpp"
#include "minidl/ops/nn/window.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

using native::ConvGeom;
using std::int64_t;

// ---- shape rules ----------------------------------------------------------------------------

// The convolution's output geometry over x [N,C,H,W] and w [K,C,KH,KW] (bias [K] optional),
// checked.
ConvGeom checked_conv_geom(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  const Shape& w = c.input(1);
  MINIDL_CHECK_NODE(c, x.rank() == 4, "expected x [N,C,H,W], got rank ", x.rank());
  MINIDL_CHECK_NODE(c, w.rank() == 4, "expected w [K,C,KH,KW], got rank ", w.rank());
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32, "expected f32");
  MINIDL_CHECK_NODE(c, w[0] > 0 && w[2] > 0 && w[3] > 0, "w must have positive dimensions");
  MINIDL_CHECK_NODE(c, x[1] == w[1], "channel mismatch: x has ", x[1], " channels, w expects ",
                    w[1]);
  const Int2 stride = int2_attr(c, "stride", 1);
  const Int2 pad = int2_attr(c, "pad", 0);
  const ConvGeom g = checked_window_geom(c, x, {w[2], w[3]}, stride, pad);
  if (c.num_inputs() > 2) {
    MINIDL_CHECK_NODE(c, c.dtype(2) == DType::F32, "expected an f32 bias");
    MINIDL_CHECK_NODE(c, c.input(2) == Shape{w[0]}, "bias must be [", w[0], "], one per filter");
  }
  return g;
}

void infer(ir::InferCtx& c) {
  const ConvGeom g = checked_conv_geom(c);
  (void)activation_attr(c);
  c.set_output(0, window_out_shape(c.input(0), c.input(1)[0], g));
}

// x, w, bias? -> y [N,K,POH,POW], argmax (i32): the max pooling (pool_kernel, pool_stride,
// pool_pad, then `activation`) of the convolution's output [N,K,OH,OW].
void infer_pooled_forward(ir::InferCtx& c) {
  const ConvGeom g = checked_conv_geom(c);
  const Shape y{c.input(0)[0], c.input(1)[0], g.OH, g.OW};
  const ConvGeom pg = checked_pool_geom(c, y, "pool_");
  (void)activation_attr(c);
  c.set_output(0, window_out_shape(y, y[1], pg));
  c.set_output(1, window_out_shape(y, y[1], pg), DType::I32);
}

// dy [N,K,OH,OW], w [K,C,KH,KW] -> dx `in_shape` [N,C,H,W]
void infer_bwd_data(ir::InferCtx& c) {
  const Shape& dy = c.input(0);
  const Shape& w = c.input(1);
  MINIDL_CHECK_NODE(c, dy.rank() == 4 && w.rank() == 4, "expected dy [N,K,OH,OW], w [K,C,KH,KW]");
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32, "expected f32");
  const auto in = c.attr<ir::Ints>("in_shape");
  MINIDL_CHECK_NODE(c, in.size() == 4, "in_shape must hold [N,C,H,W], got ", ints_str(in));
  MINIDL_CHECK_NODE(c, dy[1] == w[0], "dy has ", dy[1], " channels, w has ", w[0], " filters");
  MINIDL_CHECK_NODE(c, in[0] == dy[0] && in[1] == w[1], "in_shape ", ints_str(in),
                    " does not match dy's batch ", dy[0], " and w's ", w[1], " channels");
  const Int2 stride = int2_attr(c, "stride", 1);
  const Int2 pad = int2_attr(c, "pad", 0);
  const Shape x(in);
  const ConvGeom g = checked_window_geom(c, x, {w[2], w[3]}, stride, pad);
  MINIDL_CHECK_NODE(c, g.OH == dy[2] && g.OW == dy[3], "in_shape ", x, " gives output ", g.OH, "x",
                    g.OW, ", dy is ", dy[2], "x", dy[3]);
  c.set_output(0, x);
}

// dy [N,K,OH,OW], x [N,C,H,W] -> dw [K,C,KH,KW], KH x KW from `kernel`
void infer_bwd_weights(ir::InferCtx& c) {
  const Shape& dy = c.input(0);
  const Shape& x = c.input(1);
  MINIDL_CHECK_NODE(c, dy.rank() == 4 && x.rank() == 4, "expected dy [N,K,OH,OW], x [N,C,H,W]");
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32, "expected f32");
  MINIDL_CHECK_NODE(c, dy[0] == x[0], "batch mismatch: dy has ", dy[0], " samples, x has ", x[0]);
  const Int2 kernel = int2_attr(c, "kernel", 1);
  const Int2 stride = int2_attr(c, "stride", 1);
  const Int2 pad = int2_attr(c, "pad", 0);
  const ConvGeom g = checked_window_geom(c, x, kernel, stride, pad);
  MINIDL_CHECK_NODE(c, g.OH == dy[2] && g.OW == dy[3], "x gives output ", g.OH, "x", g.OW,
                    ", dy is ", dy[2], "x", dy[3]);
  c.set_output(0, Shape{dy[1], x[1], kernel[0], kernel[1]});
  if (c.node().def().output_names().size() > 1) c.set_output(1, Shape{dy[1]});  // dbias
}

// dy [N,K,POH,POW] and argmax (i32, dy's shape): a max pooling's output gradient and argmax over
// the convolution's output [N,K,OH,OW]; x [N,C,H,W] -> dw [K,C,KH,KW], dbias [K].
void infer_bwd_weights_pooled(ir::InferCtx& c) {
  const Shape& dy = c.input(0);
  const Shape& x = c.input(2);
  MINIDL_CHECK_NODE(c, dy.rank() == 4 && x.rank() == 4,
                    "expected dy [N,K,POH,POW], argmax of dy's shape, x [N,C,H,W]");
  MINIDL_CHECK_NODE(
      c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::I32 && c.dtype(2) == DType::F32,
      "expected f32 dy, i32 argmax and f32 x");
  MINIDL_CHECK_NODE(c, c.input(1) == dy, "argmax ", c.input(1), " must have dy's shape ", dy);
  MINIDL_CHECK_NODE(c, dy[0] == x[0], "batch mismatch: dy has ", dy[0], " samples, x has ", x[0]);
  const Int2 kernel = int2_attr(c, "kernel", 1);
  const ConvGeom g =
      checked_window_geom(c, x, kernel, int2_attr(c, "stride", 1), int2_attr(c, "pad", 0));
  const Shape y{x[0], dy[1], g.OH, g.OW};
  const ConvGeom pg = checked_pool_geom(c, y, "pool_");
  MINIDL_CHECK_NODE(c, pg.OH == dy[2] && pg.OW == dy[3], "the convolution's output ", y,
                    " pools to ", pg.OH, "x", pg.OW, ", dy is ", dy[2], "x", dy[3]);
  c.set_output(0, Shape{dy[1], x[1], kernel[0], kernel[1]});
  c.set_output(1, Shape{dy[1]});
}

// ---- native kernels -------------------------------------------------------------------------

ConvGeom node_geom(const Shape& x, std::int64_t kh, std::int64_t kw, const ir::Attrs& a) {
  return window_geom(x, kh, kw, a.get<ir::Ints>("stride"), a.get<ir::Ints>("pad"));
}

/// Calls fn(i, inner) for every i in [0, n). With at least as many items as threads the items
/// are spread over the threads and fn must run serially (inner = false: its GEMM sees that it is
/// inside a parallel region); otherwise the items run in order and fn parallelises within
/// (inner = true). Each thread takes one contiguous block of items, the same block in every
/// kernel of a step (and the block the elementwise and pooling kernels give it: parallel_for's),
/// so that a sample's values stay in the cache of the core that wrote them: handed out
/// dynamically, one at a time, the CIFAR CNN's samples were read by the other core at every
/// node, and its bf16 step took 1844 against 1717 us in kernels (--profile, 10 000 samples, the
/// weight gradients 34 and 18 us, the forwards 7 and 17 us longer). Every item writes its own
/// output, so the results do not depend on who ran what.
template <typename Fn>
void for_each_item(int64_t n, Fn&& fn) {
  const int threads = omp_in_parallel() ? 1 : max_threads();
  if (threads == 1 || n < threads) {
    for (int64_t i = 0; i < n; ++i) fn(i, threads > 1);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    try {
      fn(i, false);
    } catch (...) {  // an exception must not leave the region; rethrow one after the join
#pragma omp critical(minidl_conv2d_error)
      error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

/// Channels of one sample through im2col (or col2im), over the threads when `inner`.
template <typename Fn>
void over_channels(const ConvGeom& g, bool inner, Fn&& fn) {
  if (!inner) return fn(int64_t{0}, g.C);
  parallel_for(g.C, g.KH * g.KW * g.cols(), fn);
}

/// y[k][j] += bias[k] over one sample's output y [K, cols], then ReLU if asked.
void bias_activation(float* y, const float* bias, bool relu, int64_t oc, int64_t cols, bool inner) {
  auto rows = [&](int64_t k0, int64_t k1) {
    for (int64_t kk = k0; kk < k1; ++kk) {
      float* row = y + kk * cols;
      const float b = bias[kk];
      if (relu) {
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) {
          const float v = row[j] + b;
          row[j] = v > 0.0f ? v : 0.0f;  // NaN becomes 0, as in the GEMM's epilogue
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) row[j] += b;
      }
    }
  };
  if (inner) {
    parallel_for(oc, cols, rows);
  } else {
    rows(0, oc);
  }
}

// src [N,C,H,W], weights [K,C,KH,KW], bias [K] (optional) -> dst [N,K,OH,OW], for few input
// channels (native/direct_conv.hpp): no column matrix; the weights and bias are rearranged every
// step (SGD changes them), K*(C*KH*KW+1) floats. With fewer samples than threads each sample's
// output rows are spread over the threads instead.
ir::Kernel make_direct_conv2d_fwd(const ir::Node& node, const ConvGeom& g, int64_t oc) {
  const bool has_bias = node.inputs().size() > 2;
  const bool relu = activation_of(node.attrs()) == Activation::Relu;
  auto d = std::make_shared<const native::DirectConv>(g, oc);
  const Tensor packed = Tensor::empty(Shape{d->packed_size()});
  return [d, has_bias, relu, packed](const ir::KernelArgs& k) {
    const ConvGeom& g = d->g;
    const int64_t in_size = g.C * g.H * g.W, out_size = d->K * g.cols();
    const float* src = k.in[0].data<float>();
    float* dst = k.out[0].data<float>();
    float* p = packed.data<float>();
    native::direct_conv_pack(*d, k.in[1].data<float>(), has_bias ? k.in[2].data<float>() : nullptr,
                             p);
    for_each_item(k.in[0].shape()[0], [&](int64_t i, bool inner) {
      const float* x = src + i * in_size;
      float* y = dst + i * out_size;
      if (!inner) return native::direct_conv_fwd(*d, p, x, y, has_bias, relu, 0, g.OH);
      parallel_for(g.OH, d->K * g.OW * g.rows(), [&](int64_t b, int64_t e) {
        native::direct_conv_fwd(*d, p, x, y, has_bias, relu, b, e);
      });
    });
  };
}

// src [N,C,H,W], weights [K,C,KH,KW], bias [K] (optional) -> dst [N,K,OH,OW]
// One GEMM per sample. (Putting several samples' column matrices side by side, for a wider GEMM
// and one packing of the weights, measured no faster on the CIFAR CNN's layers.) The ReLU is
// the GEMM's store epilogue. The bias runs along the GEMM's rows, which the epilogue cannot add,
// so it enters the product instead: the weights get a column holding the bias and the column
// matrix a row of ones, one more step of the k loop rather than a pass over the output. (On two
// threads, bias and ReLU as a pass after each sample's GEMM added 5%, 39% and 41% to the CIFAR
// CNN's second and first and the MNIST CNN's convolution; folded in, 2%, 15% and 2%.) A 1x1
// stride-1 convolution multiplies x as it is, so there the bias is a pass after the GEMM.
ir::Kernel make_conv2d_fwd(const ir::Node& node) {
  const Shape& ws = node.input(1)->shape();
  const ConvGeom g = node_geom(node.input(0)->shape(), ws[2], ws[3], node.attrs());
  const int64_t oc = ws[0];
  const bool has_bias = node.inputs().size() > 2;
  if (native::direct_conv_supports(g, oc)) return make_direct_conv2d_fwd(node, g, oc);
  const bool fold_bias = has_bias && !g.is_identity();
  const bool relu = activation_of(node.attrs()) == Activation::Relu;
  // [K, C*KH*KW + 1]: the weights and the bias, rewritten every step (SGD changes both).
  const Tensor weights_bias = fold_bias ? Tensor::empty(Shape{oc, g.rows() + 1}) : Tensor();
  return [g, oc, has_bias, fold_bias, relu, weights_bias](const ir::KernelArgs& k) {
    const int64_t rows = g.rows(), cols = g.cols(), in_size = g.C * g.H * g.W;
    const int64_t depth = fold_bias ? rows + 1 : rows;  // the GEMM's k dimension
    const float* src = k.in[0].data<float>();
    const float* weights = k.in[1].data<float>();
    const float* bias = has_bias ? k.in[2].data<float>() : nullptr;
    float* dst = k.out[0].data<float>();
    if (fold_bias) {
      float* wb = weights_bias.data<float>();
      for (int64_t kk = 0; kk < oc; ++kk) {
        std::copy_n(weights + kk * rows, rows, wb + kk * depth);
        wb[kk * depth + rows] = bias[kk];
      }
      weights = wb;
    }
    const native::GemmEpilogue epilogue{nullptr, relu && (fold_bias || !has_bias)};
    for_each_item(k.in[0].shape()[0], [&](int64_t i, bool inner) {
      const float* col = src + i * in_size;  // a 1x1 stride-1 convolution reads x as it is
      if (!g.is_identity()) {
        float* buf = native::thread_scratch(depth * cols);
        over_channels(g, inner,
                      [&](int64_t c0, int64_t c1) { native::im2col(g, col, buf, c0, c1); });
        if (fold_bias) std::fill_n(buf + rows * cols, cols, 1.0f);
        col = buf;
      }
      float* y = dst + i * oc * cols;
      native::sgemm(false, false, oc, cols, depth, 1.0f, weights, depth, col, cols, 0.0f, y, cols,
                    epilogue);
      if (has_bias && !fold_bias) bias_activation(y, bias, relu, oc, cols, inner);
    });
  };
}

// diff_dst [N,K,OH,OW], weights [K,C,KH,KW] -> diff_src [N,C,H,W]
void conv2d_bwd_data(const ir::KernelArgs& k) {
  const Shape& ws = k.in[1].shape();
  const ConvGeom g = node_geom(k.out[0].shape(), ws[2], ws[3], k.attrs());
  const int64_t oc = ws[0], rows = g.rows(), cols = g.cols(), in_size = g.C * g.H * g.W;
  const float* diff_dst = k.in[0].data<float>();
  const float* weights = k.in[1].data<float>();
  float* diff_src = k.out[0].data<float>();
  for_each_item(k.in[0].shape()[0], [&](int64_t i, bool inner) {
    float* dx = diff_src + i * in_size;
    float* col = g.is_identity() ? dx : native::thread_scratch(rows * cols);
    native::sgemm(true, false, rows, cols, oc, 1.0f, weights, rows, diff_dst + i * oc * cols, cols,
                  0.0f, col, cols);
    if (!g.is_identity()) {
      over_channels(g, inner, [&](int64_t c0, int64_t c1) { native::col2im(g, col, dx, c0, c1); });
    }
  });
}

/// Samples are summed in a fixed number of contiguous chunks, each chunk in sample order into its
/// own buffer, and the chunks then in chunk order: the count depends on the shapes only, never
/// on the threads, so neither does the result. It is capped so the partial sums stay small.
int64_t weight_chunks(int64_t n, int64_t dw_size) {
  constexpr int64_t kMaxChunks = 16;
  constexpr int64_t kPartialBudget = int64_t{1} << 22;  // floats in the partial sums
  return std::max<int64_t>(1, std::min({n, kMaxChunks, kPartialBudget / dw_size + 1}));
}

/// db[k] (+)= the sum of one sample's dy rows [K, cols]: each row in one order, so the result
/// does not depend on the threads.
void sum_rows(const float* dy, float* db, bool first, int64_t oc, int64_t cols, bool inner) {
  auto rows = [&](int64_t k0, int64_t k1) {
    for (int64_t kk = k0; kk < k1; ++kk) {
      const float* row = dy + kk * cols;
      float part = 0.0f;
#pragma omp simd reduction(+ : part)
      for (int64_t j = 0; j < cols; ++j) part += row[j];
      db[kk] = first ? part : db[kk] + part;
    }
  };
  if (inner) {
    parallel_for(oc, cols, rows);
  } else {
    rows(0, oc);
  }
}

// diff_dst [N,K,OH,OW], src [N,C,H,W] -> diff_weights [K,C,KH,KW] (conv2d_bwd_weights), and
// diff_bias [K] (conv2d_bwd_weights_bias): each sample's dy rows are summed right after its GEMM
// read them, while they are in cache, in the same chunks as the weights.
ir::Kernel make_conv2d_bwd_weights(const ir::Node& node) {
  const ir::Ints kernel = node.attrs().get<ir::Ints>("kernel");
  const ConvGeom g = node_geom(node.input(1)->shape(), kernel[0], kernel[1], node.attrs());
  const int64_t n = node.input(1)->shape()[0], oc = node.input(0)->shape()[1];
  const bool bias = node.outputs().size() > 1;
  const int64_t dw_size = oc * g.rows();
  const int64_t part_size = dw_size + (bias ? oc : 0);  // a chunk's weights, then its bias
  // Few input channels: the direct kernel (native/direct_conv.hpp) in place of im2col and GEMM.
  // It keeps its sums in registers over a whole chunk, so it takes chunks of 8 samples (fewer
  // partial sums to reduce and add) rather than one GEMM's worth.
  std::shared_ptr<const native::DirectConv> direct;
  if (native::direct_conv_supports(g, oc)) direct = std::make_shared<native::DirectConv>(g, oc);
  const int64_t chunks = direct ? std::min<int64_t>(16, (n + 7) / 8) : weight_chunks(n, dw_size);
  // Chunk 0 sums straight into the outputs; the others into buffers owned by the kernel.
  const Tensor partials = Tensor::empty(Shape{chunks - 1, part_size});
  return [g, n, oc, bias, dw_size, part_size, chunks, partials, direct](const ir::KernelArgs& k) {
    const int64_t rows = g.rows(), cols = g.cols(), in_size = g.C * g.H * g.W;
    const float* diff_dst = k.in[0].data<float>();
    const float* src = k.in[1].data<float>();
    float* dw = k.out[0].data<float>();
    float* db = bias ? k.out[1].data<float>() : nullptr;
    float* part = partials.data<float>();
    for_each_item(chunks, [&](int64_t ci, bool inner) {
      float* acc = ci == 0 ? dw : part + (ci - 1) * part_size;
      float* acc_bias = ci == 0 ? db : acc + dw_size;
      const int64_t i0 = n * ci / chunks, i1 = n * (ci + 1) / chunks;
      if (direct) {
        return native::direct_conv_bwd_weights(*direct, diff_dst + i0 * oc * cols,
                                               src + i0 * in_size, i1 - i0, acc,
                                               bias ? acc_bias : nullptr, inner);
      }
      for (int64_t i = i0; i < i1; ++i) {
        const float* col = src + i * in_size;
        if (!g.is_identity()) {
          float* buf = native::thread_scratch(rows * cols);
          over_channels(g, inner,
                        [&](int64_t c0, int64_t c1) { native::im2col(g, col, buf, c0, c1); });
          col = buf;
        }
        const float* dy = diff_dst + i * oc * cols;
        native::sgemm(false, true, oc, rows, cols, 1.0f, dy, cols, col, cols, i == i0 ? 0.0f : 1.0f,
                      acc, rows);
        if (bias) sum_rows(dy, acc_bias, i == i0, oc, cols, inner);
      }
    });
    if (chunks == 1) return;
    parallel_for(dw_size, chunks, [&](int64_t b, int64_t e) {
      for (int64_t ci = 1; ci < chunks; ++ci) {
        const float* p = part + (ci - 1) * part_size;
#pragma omp simd
        for (int64_t j = b; j < e; ++j) dw[j] += p[j];
      }
    });
    if (!bias) return;
    for (int64_t ci = 1; ci < chunks; ++ci) {
      const float* p = part + (ci - 1) * part_size + dw_size;
      for (int64_t kk = 0; kk < oc; ++kk) db[kk] += p[kk];
    }
  };
}

// ---- 16 channels, channels innermost ------------------------------------------------------------

// 3x3 convolutions between 16 channels in the layout where a position's 16 channels lie side by
// side (native/conv16.hpp). These kernels take no other layout: layout propagation gives the
// values around such a convolution the blocked layout for oneDNN's kernels (the anchors, chosen
// first while every value is plain), and then these, tried first (preferred), take the nodes. On
// plain values, and with --backend native, the other kernels run.

/// Why conv16 cannot take a node whose activations are `acts` and whose weights (or weight
/// gradient) `w`, or "" when it can.
std::string conv16_refusal(const ir::Node& n, const ConvGeom& g, int64_t filters,
                           std::initializer_list<const ir::Value*> acts, const ir::Value* w) {
  if (!native::conv16_supports(g, filters))
    return "takes 3x3 convolutions of stride 1 and padding 1 between 16 channels, on a CPU with "
           "AVX-512";
  if (ir::node_precision(n) == ir::Precision::BF16) return "computes in f32 only";
  for (const ir::Value* v : acts) {
    const bool innermost =
        v->layout() == "nhwc" || (!v->layout().empty() && ir::channel_block(v->layout()) == 16);
    if (!innermost)
      return fmt::format("takes {} only with its 16 channels innermost (nChw16c or nhwc), not {}",
                         v->ref(), v->layout().empty() ? "plain" : v->layout());
  }
  if (!w->layout().empty()) return fmt::format("takes {} plain only", w->ref());
  return "";
}

ConvGeom conv16_geom(const ir::Node& n, const Shape& x) { return node_geom(x, 3, 3, n.attrs()); }

/// The forward and the data gradient: x and y, or dy and dx, around w [16,16,3,3]; `x_side` is
/// the one shaped as the convolution's input (x, or dx).
bool conv16_rows_supports(const ir::Node& n, const ir::Value* x_side, std::string* why) {
  const Shape& w = n.input(1)->shape();
  if (w[2] != 3 || w[3] != 3) return decline("takes 3x3 windows only", why);
  return decline(conv16_refusal(n, conv16_geom(n, x_side->shape()), w[0], {n.input(0), n.output(0)},
                                n.input(1)),
                 why);
}

bool conv16_fwd_supports(const ir::Node& n, std::string* why) {
  return conv16_rows_supports(n, n.input(0), why);
}

bool conv16_bwd_data_supports(const ir::Node& n, std::string* why) {
  return conv16_rows_supports(n, n.output(0), why);
}

bool conv16_bwd_weights_supports(const ir::Node& n, std::string* why) {
  if (n.outputs().size() > 1) return decline("computes no bias gradient", why);
  const ir::Ints& kernel = n.attrs().get<ir::Ints>("kernel");
  if (kernel[0] != 3 || kernel[1] != 3) return decline("takes 3x3 windows only", why);
  return decline(conv16_refusal(n, conv16_geom(n, n.input(1)->shape()), n.input(0)->shape()[1],
                                {n.input(0), n.input(1)}, n.output(0)),
                 why);
}

/// y = x (*) w (+ bias, ReLU), or dx = dy (*) w turned (`transposed`): the weights packed every
/// step (SGD changes them), then the output rows of all samples spread over the threads.
ir::Kernel make_conv16_rows(const ir::Node& node, bool transposed) {
  const bool has_bias = !transposed && node.inputs().size() > 2;
  const bool relu = !transposed && activation_of(node.attrs()) == Activation::Relu;
  const Tensor packed = Tensor::empty(Shape{native::kConv16PackedSize});
  return [packed, transposed, has_bias, relu](const ir::KernelArgs& k) {
    const Shape& s = k.out[0].shape();
    const int64_t h = s[2], w = s[3];
    float* p = packed.data<float>();
    native::conv16_pack(k.in[1].data<float>(), transposed, p);
    const float* bias = has_bias ? k.in[2].data<float>() : nullptr;
    const float* x = k.in[0].data<float>();
    float* y = k.out[0].data<float>();
    parallel_for(s[0] * h, w * native::kConv16PackedSize * 2, [&](int64_t r0, int64_t r1) {
      native::conv16_rows(p, bias, relu, x, y, h, w, r0, r1);
    });
  };
}

ir::Kernel make_conv16_fwd(const ir::Node& node) { return make_conv16_rows(node, false); }
ir::Kernel make_conv16_bwd_data(const ir::Node& node) { return make_conv16_rows(node, true); }

/// dw: samples summed in ceil(N / 8) contiguous chunks (at most 16), each in sample order into
/// its own accumulator, then the chunks in chunk order: the bits depend on the shapes only, not
/// on the threads.
ir::Kernel make_conv16_bwd_weights(const ir::Node& node) {
  const int64_t n = node.input(1)->shape()[0];
  const int64_t chunks = std::min<int64_t>(16, (n + 7) / 8);
  const Tensor acc = Tensor::empty(Shape{chunks, native::kConv16PackedSize});
  return [n, chunks, acc](const ir::KernelArgs& k) {
    const Shape& s = k.in[1].shape();
    const int64_t h = s[2], w = s[3], plane = h * w * native::kConv16Channels;
    const float* dy = k.in[0].data<float>();
    const float* x = k.in[1].data<float>();
    float* a = acc.data<float>();
    for_each_item(chunks, [&](int64_t ci, bool) {
      float* part = a + ci * native::kConv16PackedSize;
      std::fill_n(part, native::kConv16PackedSize, 0.0f);
      for (int64_t i = n * ci / chunks; i < n * (ci + 1) / chunks; ++i)
        native::conv16_bwd_weights_sample(dy + i * plane, x + i * plane, h, w, part);
    });
    for (int64_t ci = 1; ci < chunks; ++ci) {
      const float* part = a + ci * native::kConv16PackedSize;
#pragma omp simd
      for (int64_t j = 0; j < native::kConv16PackedSize; ++j) a[j] += part[j];
    }
    native::conv16_unpack_weights(a, k.out[0].data<float>());
  };
}

// ---- bf16 weight gradient on AMX tiles or AVX512-BF16 dot products --------------------------

// The weight gradient of a node marked bf16, with the bias gradient when the node has one: dy and
// x as they are stored (bf16 activations in their layout, or f32 rounded while packed), dw and db
// in f32. On AMX tiles where the CPU has AMX-BF16 (native/conv_amx.hpp), on AVX512-BF16 dot
// products where it has those only (native/conv_bf16.hpp). Tried before oneDNN's bf16 kernel
// (both are bf16 kernels; this one is declared first).

/// Why the kernel cannot take node n, or "".
std::string bf16_wgrad_refusal(const ir::Node& n) {
  if (ir::node_precision(n) != ir::Precision::BF16)
    return "computes in bf16 only (nodes marked precision=bf16)";
  const bool amx = native::amx_bf16_unavailable().empty();
  if (!amx) {
    if (std::string why = native::dot_bf16_unavailable(); !why.empty())
      return fmt::format("{} (AMX: {})", why, native::amx_bf16_unavailable());
  }
  const ir::Ints& stride = n.attrs().get<ir::Ints>("stride");
  if (stride[0] != 1 || stride[1] != 1) return "takes stride 1 only";
  const int64_t filters = n.input(0)->shape()[1];
  if (filters % 16 != 0)
    return fmt::format("takes filter counts that are multiples of 16, not {}", filters);
  for (const ir::Value* v : n.outputs())
    if (!v->layout().empty()) return fmt::format("writes {} plain only", v->ref());
  if (amx) return "";
  // The dot-product kernel pairs positions along output rows: on rows of 8 (ResNet-20's third
  // stage) its loops were too short, 1381-1553 us per call against oneDNN's 1289-1307
  // (--profile, bf16, batch 128, AMD EPYC).
  constexpr int64_t kMinRow = 16;
  if (const int64_t row = n.input(0)->shape()[3]; row < kMinRow)
    return fmt::format("takes output rows of at least {} positions, not {}", kMinRow, row);
  // An f32 input of few channels spends the dot-product kernel's time on rounding and packing:
  // ResNet-20's first layer (the f32 image, 3 channels, 16 filters) took 1428-1567 us per call
  // against oneDNN's 531-543, and with its rows rounded 16 at a time about 1100 us on one thread
  // (a stand-alone driver), no better than oneDNN. The CIFAR CNN's first layer reads the image's
  // bf16 copy instead.
  const ir::Value& x = *n.input(1);
  if (x.stored() != DType::BF16 && x.shape()[1] < 16)
    return fmt::format("takes {} of {} channels only stored as bf16 (a bf16 copy)", x.ref(),
                       x.shape()[1]);
  return "";
}

bool bf16_wgrad_supports(const ir::Node& n, std::string* why) {
  return decline(bf16_wgrad_refusal(n), why);
}

native::ActLayout act_layout(const ir::Value& v) {
  return {.block = v.layout() == "nhwc" ? v.shape()[1] : ir::channel_block(v.layout()),
          .bf16 = v.stored() == DType::BF16};
}

/// Samples summed in chunks as the 16-channel kernel's (make_conv16_bwd_weights), each chunk into
/// its own accumulator and then the chunks in order: the bits depend on the shapes only.
/// sum(k, n0, n1, acc, bias_acc, scratch) sums samples [n0, n1) of the node's inputs into acc
/// (and bias_acc, unless null); scratch holds scratch_floats floats.
template <typename Sum>
ir::Kernel chunked_wgrad(const ir::Node& node, const ConvGeom& g, std::size_t scratch_floats,
                         Sum sum) {
  const int64_t n = node.input(0)->shape()[0], filters = node.output(0)->shape()[0],
                rows = g.rows();
  const int64_t chunks = std::min<int64_t>(16, (n + 7) / 8);
  const int64_t part = rows * filters + filters;  // dw's accumulator, then db's
  const Tensor acc = Tensor::empty(Shape{chunks, part});
  const bool bias = node.outputs().size() > 1;
  return [=](const ir::KernelArgs& k) {
    float* a = acc.data<float>();
    for_each_item(chunks, [&](int64_t ci, bool) {
      float* p = a + ci * part;
      float* db = bias ? p + rows * filters : nullptr;
      std::fill_n(p + rows * filters, filters, 0.0f);
      sum(k, n * ci / chunks, n * (ci + 1) / chunks, p, db, native::thread_scratch(scratch_floats));
    });
    float* dw = k.out[0].data<float>();
    parallel_for(rows, filters * chunks, [&](int64_t i0, int64_t i1) {
      native::conv_bf16_unpack(a, chunks, part, rows, filters, dw, i0, i1);
    });
    if (!bias) return;
    float* db = k.out[1].data<float>();
    for (int64_t f = 0; f < filters; ++f) {
      float s = a[rows * filters + f];
      for (int64_t ci = 1; ci < chunks; ++ci) s += a[ci * part + rows * filters + f];
      db[f] = s;
    }
  };
}

ir::Kernel make_bf16_wgrad(const ir::Node& node) {
  const ir::Ints& kernel = node.attrs().get<ir::Ints>("kernel");
  const ConvGeom g = node_geom(node.input(1)->shape(), kernel[0], kernel[1], node.attrs());
  const int64_t filters = node.input(0)->shape()[1];
  const native::ActLayout dy_layout = act_layout(*node.input(0)),
                          x_layout = act_layout(*node.input(1));
  const bool amx = native::amx_bf16_unavailable().empty();
  // thread_scratch gives floats; the dot-product kernel packs 32-bit words of two bf16 into it.
  const auto scratch_floats =
      static_cast<std::size_t>(amx ? native::conv_amx_scratch_floats(g, filters)
                                   : native::conv_bf16_scratch_words(g, filters));
  return chunked_wgrad(
      node, g, scratch_floats,
      [=](const ir::KernelArgs& k, int64_t n0, int64_t n1, float* p, float* db, float* scratch) {
        if (amx) {
          native::conv_amx_bwd_weights(g, filters, k.in[0].raw(), dy_layout, k.in[1].raw(),
                                       x_layout, n0, n1, p, db, scratch);
        } else {
          native::conv_bf16_bwd_weights(g, filters, k.in[0].raw(), dy_layout, k.in[1].raw(),
                                        x_layout, n0, n1, p, db,
                                        reinterpret_cast<std::uint32_t*>(scratch));
        }
      });
}

// conv2d_bwd_weights_bias_pooled on AMX tiles: the weight gradient's kernel above, packing dy
// from the pooling's output gradient and argmax (native::PooledGrad).

/// What every convolution kernel on AMX tiles asks of node n: marked bf16, a CPU with usable
/// AMX-BF16, stride 1; "" when it has them.
std::string amx_node_refusal(const ir::Node& n) {
  if (ir::node_precision(n) != ir::Precision::BF16)
    return "computes in bf16 only (nodes marked precision=bf16)";
  if (std::string why = native::amx_bf16_unavailable(); !why.empty()) return why;
  const ir::Ints& stride = n.attrs().get<ir::Ints>("stride");
  if (stride[0] != 1 || stride[1] != 1) return "takes stride 1 only";
  return "";
}

/// What both kernels of conv2d_bwd_weights_bias_pooled ask of node n: disjoint pooling windows
/// without padding, argmax in dy's layout, plain outputs; "" when it has them.
std::string pooled_node_refusal(const ir::Node& n) {
  const ir::Ints& pk = n.attrs().get<ir::Ints>("pool_kernel");
  const ir::Ints ps = pool_stride(n.attrs(), "pool_");
  const ir::Ints& pp = n.attrs().get<ir::Ints>("pool_pad");
  if (pp[0] != 0 || pp[1] != 0 || ps[0] < pk[0] || ps[1] < pk[1])
    return "takes poolings of disjoint windows without padding only";
  if (n.input(0)->layout() != n.input(1)->layout())
    return fmt::format("takes {} in {}'s layout only", n.input(1)->ref(), n.input(0)->ref());
  for (const ir::Value* v : n.outputs())
    if (!v->layout().empty()) return fmt::format("writes {} plain only", v->ref());
  return "";
}

/// Why the AMX kernel cannot take node n, or "".
std::string pooled_wgrad_refusal(const ir::Node& n) {
  if (std::string why = amx_node_refusal(n); !why.empty()) return why;
  if (const int64_t filters = n.input(0)->shape()[1]; filters % 16 != 0)
    return fmt::format("takes filter counts that are multiples of 16, not {}", filters);
  return pooled_node_refusal(n);
}

bool pooled_wgrad_supports(const ir::Node& n, std::string* why) {
  return decline(pooled_wgrad_refusal(n), why);
}

/// The convolution's geometry of a conv2d_bwd_weights_bias_pooled node.
ConvGeom pooled_node_geom(const ir::Node& n) {
  const ir::Ints& kernel = n.attrs().get<ir::Ints>("kernel");
  return node_geom(n.input(2)->shape(), kernel[0], kernel[1], n.attrs());
}

/// The pooling's geometry of a conv2d_bwd_weights_bias_pooled node, its tensors left for the call.
native::PooledGrad pooled_grad(const ir::Node& node) {
  const Shape& dys = node.input(0)->shape();
  const ir::Ints& pk = node.attrs().get<ir::Ints>("pool_kernel");
  const ir::Ints ps = pool_stride(node.attrs(), "pool_");
  return {.layout = act_layout(*node.input(0)),
          .POH = dys[2],
          .POW = dys[3],
          .KH = pk[0],
          .KW = pk[1],
          .SH = ps[0],
          .SW = ps[1]};
}

/// The chunked weight gradient over a pooling's gradient with one of the two kernels, which share
/// their arguments: on AMX tiles (amx) or in f32 (native::direct_conv_bwd_weights_pooled).
ir::Kernel make_pooled_wgrad_on(const ir::Node& node, bool amx) {
  const ConvGeom g = pooled_node_geom(node);
  const int64_t filters = node.input(0)->shape()[1];
  const native::PooledGrad pooled = pooled_grad(node);
  const native::ActLayout x_layout = act_layout(*node.input(2));
  const auto sum =
      amx ? native::conv_amx_bwd_weights_pooled : native::direct_conv_bwd_weights_pooled;
  const int64_t scratch =
      amx ? native::conv_amx_scratch_floats(g, filters)
          : native::direct_conv_pooled_scratch_floats(g, filters, pooled.POH * pooled.POW);
  return chunked_wgrad(
      node, g, static_cast<std::size_t>(scratch),
      [=](const ir::KernelArgs& k, int64_t n0, int64_t n1, float* p, float* db, float* scratch) {
        native::PooledGrad dy = pooled;
        dy.dy = k.in[0].raw();
        dy.argmax = k.in[1].data<std::int32_t>();
        sum(g, filters, dy, k.in[2].raw(), x_layout, n0, n1, p, db, scratch);
      });
}

ir::Kernel make_pooled_wgrad(const ir::Node& node) { return make_pooled_wgrad_on(node, true); }

// conv2d_bwd_weights_bias_pooled in f32 (native/direct_conv.hpp): per window, only the position
// its argmax names, for a convolution of few input channels (a first layer). The CIFAR CNN's
// first layer took 351-361 us per step against 270-283 for oneDNN's weight gradient and 271-287
// for the pooling's backward before it (--profile, f32, 10 000 samples, alternating runs); the
// MNIST CNN's 43-44 against 35-36 for the direct weight gradient and 13 for the pooling's, and
// under --precision bf16 (8 filters: no AMX kernel) 39-42 against 130 for oneDNN's bf16 weight
// gradient and 23-33 for the pooling's backward.

/// Why the f32 kernel cannot take node n, or "".
std::string direct_pooled_wgrad_refusal(const ir::Node& n) {
  if (std::string why = native::direct_conv_pooled_refusal(pooled_node_geom(n)); !why.empty())
    return why;
  return pooled_node_refusal(n);
}

bool direct_pooled_wgrad_supports(const ir::Node& n, std::string* why) {
  return decline(direct_pooled_wgrad_refusal(n), why);
}

ir::Kernel make_direct_pooled_wgrad(const ir::Node& node) {
  return make_pooled_wgrad_on(node, false);
}

// ---- bf16 forward and data gradient on AMX tiles --------------------------------------------

// A node marked bf16 on the CPU's AMX tiles (native/conv_amx.hpp): x (dy) as it is stored, the
// weights as stored (f32, or a bf16 copy), packed per call; y (dx) in its own layout and type.
// Tried before oneDNN's bf16 kernel where the CPU has AMX-BF16.

/// Why the kernel cannot take node n (conv2d, or conv2d_bwd_data when `data_grad`), or "".
std::string amx_conv_refusal(const ir::Node& n, bool data_grad) {
  if (std::string why = amx_node_refusal(n); !why.empty()) return why;
  const ir::Value& w = *n.input(1);
  if (!w.layout().empty()) return fmt::format("takes {} plain only", w.ref());
  // f32 activations it would convert element by element: ResNet-20's first stage, between f32
  // BatchNorms in nChw16c, took 5.8 ms per data gradient against oneDNN's 2.3-2.4 (--profile).
  for (const ir::Value* v : {n.input(0), n.output(0)})
    if (v->stored() != DType::BF16)
      return fmt::format("takes activations stored as bf16 only, not {}", v->ref());
  const int64_t out = w.shape()[data_grad ? 1 : 0];
  if (out % 16 != 0)
    return fmt::format("takes output channel counts that are multiples of 16, not {}", out);
  const ir::Ints& pad = n.attrs().get<ir::Ints>("pad");
  if (data_grad && (pad[0] >= w.shape()[2] || pad[1] >= w.shape()[3]))
    return "takes padding smaller than the window only";
  // A window row of fewer than 32 values fills one run: oneDNN's kernels pad its channels to a
  // block of 16 instead (the CIFAR CNN's first layer, 3 x 3 channels: 99 against 118 us per
  // call in minidl_bench). On wider rows oneDNN's forward was the faster (conv2, 32 channels:
  // 106 against 143 us); its data gradient was not (156 against 146 us, and 160-242 against 122
  // us per step in training, --profile).
  if (const int64_t row = w.shape()[3] * w.shape()[1]; !data_grad && row >= 32)
    return fmt::format("leaves window rows of 32 values or more ({} x {}) to oneDNN's forward",
                       w.shape()[3], w.shape()[1]);
  return "";
}

bool amx_conv_fwd_supports(const ir::Node& n, std::string* why) {
  return decline(amx_conv_refusal(n, false), why);
}
bool amx_conv_bwd_data_supports(const ir::Node& n, std::string* why) {
  return decline(amx_conv_refusal(n, true), why);
}

/// The forward over x, or the data gradient as the forward over dy with the weights transposed
/// and turned and the padding KH - 1 - PH (KW - 1 - PW). Samples are independent items: the
/// bits do not depend on the thread count.
ir::Kernel make_amx_conv(const ir::Node& node, bool data_grad) {
  const Shape& ws = node.input(1)->shape();
  const Shape& in = node.input(0)->shape();
  ConvGeom g;
  int64_t K = ws[0];
  if (!data_grad) {
    g = node_geom(in, ws[2], ws[3], node.attrs());
  } else {
    const ir::Ints& pad = node.attrs().get<ir::Ints>("pad");
    const Shape& out = node.output(0)->shape();
    K = ws[1];
    g = {.C = ws[0],
         .H = in[2],
         .W = in[3],
         .KH = ws[2],
         .KW = ws[3],
         .PH = ws[2] - 1 - pad[0],
         .PW = ws[3] - 1 - pad[1],
         .OH = out[2],
         .OW = out[3]};
  }
  const int64_t n = in[0];
  const Tensor packed = Tensor::empty(Shape{(native::conv_amx_weight_halves(g, K) + 1) / 2});
  const bool bias = !data_grad && node.inputs().size() > 2;
  const bool relu = !data_grad && activation_of(node.attrs()) == Activation::Relu;
  const bool w_bf16 = node.input(1)->stored() == DType::BF16;
  const native::ActLayout x_layout = act_layout(*node.input(0)),
                          y_layout = act_layout(*node.output(0));
  const auto scratch_floats =
      static_cast<std::size_t>(native::conv_amx_forward_scratch_floats(g, K));
  return [=](const ir::KernelArgs& k) {
    auto* pw = reinterpret_cast<std::uint16_t*>(packed.data<float>());
    native::conv_amx_pack_weights(g, K, {k.in[1].raw(), w_bf16, data_grad}, pw);
    const float* b = bias ? k.in[2].data<float>() : nullptr;
    for_each_item(n, [&](int64_t i, bool) {
      native::conv_amx_forward(g, K, k.in[0].raw(), x_layout, pw, b, relu, k.out[0].raw(), y_layout,
                               i, i + 1, native::thread_scratch(scratch_floats));
    });
  };
}

ir::Kernel make_amx_conv_fwd(const ir::Node& node) { return make_amx_conv(node, false); }

// conv2d_max_pool2d on AMX tiles: per sample, the forward above into a per-thread buffer (bf16,
// nhwc: 64 KiB for the CIFAR CNN's first layer, 32 KiB for its second, in the second-level
// cache), then max_pool2d's own row kernel over it into y and argmax. The bits of the AMX forward
// and the pooling as two nodes, the convolution's output stored as bf16.

/// Why the kernel cannot take node n, or "".
std::string pooled_forward_refusal(const ir::Node& n) {
  if (std::string why = amx_node_refusal(n); !why.empty()) return why;
  if (!pool::avx512_kernels()) return "runs max_pool2d's AVX-512 kernels only";
  const ir::Value& w = *n.input(1);
  if (!w.layout().empty()) return fmt::format("takes {} plain only", w.ref());
  if (n.input(0)->stored() != DType::BF16)
    return fmt::format("takes {} stored as bf16 only", n.input(0)->ref());
  if (w.shape()[0] % 16 != 0)
    return fmt::format("takes filter counts that are multiples of 16, not {}", w.shape()[0]);
  // Unlike the AMX forward alone, it also takes window rows of 32 values or more, where oneDNN's
  // forward is faster than the AMX one: with the pooling, which then reads the output from the
  // second-level cache, the CIFAR CNN's second layer took 213-216 us per step against 177-178
  // for oneDNN's forward and 93-98 for the pooling (--profile, three alternating pairs).
  return "";
}

bool pooled_forward_supports(const ir::Node& n, std::string* why) {
  return decline(pooled_forward_refusal(n), why);
}

ir::Kernel make_pooled_forward(const ir::Node& node) {
  const Shape& ws = node.input(1)->shape();
  const Shape& xs = node.input(0)->shape();
  const ConvGeom g = node_geom(xs, ws[2], ws[3], node.attrs());
  const int64_t n = xs[0], K = ws[0];
  const Tensor packed = Tensor::empty(Shape{(native::conv_amx_weight_halves(g, K) + 1) / 2});
  const bool bias = node.inputs().size() > 2;
  const bool w_bf16 = node.input(1)->stored() == DType::BF16;
  const native::ActLayout x_layout = act_layout(*node.input(0));
  // The pooling over the convolution's output, one sample of it in the buffer (n = 0).
  pool::FwdArgs a;
  a.g = pool_geom(Shape{1, K, g.OH, g.OW}, node.attrs(), "pool_");
  a.x = {.channels = K, .plane = g.OH * g.OW, .block = K, .nhwc = true};
  a.y = pool::addr_of(*node.output(0), a.g.OH * a.g.OW);
  a.am = pool::addr_of(*node.output(1), a.g.OH * a.g.OW);
  a.groups_per_n = 1;
  a.contiguous = pool::same_addr(a.x, a.y) && pool::same_addr(a.x, a.am);
  a.relu = activation_of(node.attrs()) == Activation::Relu;
  const auto plain = [](const pool::Addr& v) { return v.block == 1 && !v.nhwc; };
  const bool to_plain = !a.contiguous && plain(a.y) && plain(a.am);
  const bool y_bf16 = node.output(0)->stored() == DType::BF16;
  const int64_t conv_floats = native::conv_amx_forward_scratch_floats(g, K),
                y_halves = K * g.OH * g.OW, y_sample = K * a.g.OH * a.g.OW,
                x_bytes = g.C * g.H * g.W * (x_layout.bf16 ? 2 : 4);
  const auto scratch_floats = static_cast<std::size_t>(conv_floats + (y_halves + 1) / 2 + 16);
  return [=](const ir::KernelArgs& k) {
    auto* pw = reinterpret_cast<std::uint16_t*>(packed.data<float>());
    native::conv_amx_pack_weights(g, K, {k.in[1].raw(), w_bf16, false}, pw);
    const float* b = bias ? k.in[2].data<float>() : nullptr;
    for_each_item(n, [&](int64_t i, bool) {
      float* scratch = native::thread_scratch(scratch_floats);
      auto* y1 = reinterpret_cast<std::uint16_t*>(scratch + conv_floats + 16 - conv_floats % 16);
      native::conv_amx_forward(g, K, static_cast<const char*>(k.in[0].raw()) + i * x_bytes,
                               x_layout, pw, b, false, y1, {.block = K, .bf16 = true}, 0, 1,
                               scratch);
      std::int32_t* am = k.out[1].data<std::int32_t>() + i * y_sample;
      const auto pool_into = [&](auto* y) {
        if (to_plain) return pool::fwd_planes_to_plain_avx512(a, y1, y, am, 0, 1);
        pool::fwd_rows_avx512(a, y1, y, am, 0, a.g.OH);
      };
      if (y_bf16) {
        pool_into(static_cast<std::uint16_t*>(k.out[0].raw()) + i * y_sample);
      } else {
        pool_into(k.out[0].data<float>() + i * y_sample);
      }
    });
  };
}

ir::Kernel make_amx_conv_bwd_data(const ir::Node& node) { return make_amx_conv(node, true); }

// ---- gradient -------------------------------------------------------------------------------

// With bias and ReLU: dz = relu_bwd(dy, y), dbias = bias_add_bwd(dz), then the plain rule on dz.
void grad(ir::GradCtx& g) {
  ir::Value* dy = fused_bias_activation_grad(g, 2);
  const Shape& x = g.input(0)->shape();
  const Shape& w = g.input(1)->shape();
  const auto stride = g.attrs().get<ir::Ints>("stride");
  const auto pad = g.attrs().get<ir::Ints>("pad");
  if (g.needs_input_grad(0)) {
    g.set_input_grad(0, g.op(op_conv2d_bwd_data, {dy, g.input(1)},
                             {{"stride", stride}, {"pad", pad}, {"in_shape", x.dims()}}));
  }
  if (g.needs_input_grad(1)) {
    g.set_input_grad(1, g.op(op_conv2d_bwd_weights, {dy, g.input(0)},
                             {{"stride", stride}, {"pad", pad}, {"kernel", ir::Ints{w[2], w[3]}}}));
  }
}

// 2 * (elements of the product's output) * (inputs each sums over): for every convolution pass
// the product's output is one of y, dy, dw and each element sums C*R*S or N*OH*OW terms.
std::int64_t conv_flops(const ir::Node& n) {
  const bool fwd = n.op() == "conv2d_max_pool2d";
  if (fwd || n.op() == "conv2d_bwd_weights_bias_pooled") {
    // The convolution's own product, over its output positions (the pooling's input).
    const Shape& w = fwd ? n.input(1)->shape() : n.output(0)->shape();
    const Shape& x = n.input(fwd ? 0 : 2)->shape();
    const ConvGeom g = node_geom(x, w[2], w[3], n.attrs());
    return 2 * x[0] * w[0] * g.OH * g.OW * (w.numel() / w[0]);
  }
  const bool dw = n.op() == "conv2d_bwd_weights" || n.op() == "conv2d_bwd_weights_bias";
  const Shape& w = dw ? n.output(0)->shape() : n.input(1)->shape();
  const Shape& y = n.op() == "conv2d" ? n.output()->shape() : n.input(0)->shape();
  return 2 * y.numel() * (w.numel() / w[0]);
}

}  // namespace

MINIDL_OP(conv2d)
    .inputs({"x", "w", "bias?"})
    .attr<ir::Ints>("stride", ir::Ints{1, 1})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<std::string>("activation", "none")
    .infer(infer)
    .flops(conv_flops)
    .kernel_factory(ir::Backend::Native, "native", make_amx_conv_fwd, amx_conv_fwd_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::conv2d_kernel, onednn::conv2d_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#endif
    .kernel_factory(ir::Backend::Native, "native16", make_conv16_fwd, conv16_fwd_supports)
    .layout_aware()
    .preferred()
    .kernel_factory(ir::Backend::Native, "native", make_conv2d_fwd)
    .grad(grad);

MINIDL_OP(conv2d_bwd_data)
    .inputs({"dy", "w"})
    .outputs({"dx"})
    .attr<ir::Ints>("stride", ir::Ints{1, 1})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<ir::Ints>("in_shape")
    .infer(infer_bwd_data)
    .flops(conv_flops)
    .kernel_factory(ir::Backend::Native, "native", make_amx_conv_bwd_data,
                    amx_conv_bwd_data_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::conv2d_bwd_data_kernel,
                    onednn::conv2d_bwd_data_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#endif
    .kernel_factory(ir::Backend::Native, "native16", make_conv16_bwd_data, conv16_bwd_data_supports)
    .layout_aware()
    .preferred()
    .kernel(ir::Backend::Native, conv2d_bwd_data)
    .no_grad("backward-only op; second derivatives are not supported");

MINIDL_OP(conv2d_bwd_weights)
    .inputs({"dy", "x"})
    .outputs({"dw"})
    .attr<ir::Ints>("stride", ir::Ints{1, 1})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<ir::Ints>("kernel")
    .infer(infer_bwd_weights)
    .flops(conv_flops)
    .kernel_factory(ir::Backend::Native, "native", make_bf16_wgrad, bf16_wgrad_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::conv2d_bwd_weights_kernel,
                    onednn::conv2d_bwd_weights_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#endif
    .kernel_factory(ir::Backend::Native, "native16", make_conv16_bwd_weights,
                    conv16_bwd_weights_supports)
    .layout_aware()
    .preferred()
    .kernel_factory(ir::Backend::Native, "native", make_conv2d_bwd_weights)
    .no_grad("backward-only op; second derivatives are not supported");

// The weight and bias gradients of a convolution in one pass over dy (the fusion pass
// fuse-bias-into-weight-gradient builds it from conv2d_bwd_weights and the bias_add_bwd reading
// the same dy): oneDNN's backward-weights primitive with its diff_bias, the native kernel's row
// sums after each sample's GEMM. The bias sum's order differs from bias_add_bwd's, so its bits
// may too.
MINIDL_OP(conv2d_bwd_weights_bias)
    .inputs({"dy", "x"})
    .outputs({"dw", "dbias"})
    .attr<ir::Ints>("stride", ir::Ints{1, 1})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<ir::Ints>("kernel")
    .infer(infer_bwd_weights)
    .flops(conv_flops)
    .kernel_factory(ir::Backend::Native, "native", make_bf16_wgrad, bf16_wgrad_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::conv2d_bwd_weights_kernel,
                    onednn::conv2d_bwd_weights_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
#endif
    .kernel_factory(ir::Backend::Native, "native", make_conv2d_bwd_weights)
    .no_grad("backward-only op; second derivatives are not supported");

// conv2d_bwd_weights_bias(max_pool2d_bwd(dy, argmax), x) in one node, the pooling's input
// gradient never written: a convolution whose output only a max pooling reads, and whose output
// gradient only its weight gradient reads (a first layer). Made by
// fuse-pool-backward-into-weight-gradient (ops/fusion.hpp) where one of its kernels takes the
// node, for disjoint windows: bf16 on AMX tiles, the same bits as the two nodes it replaces; or f32
// for few input channels (window rows of at most 16 values), the same sums in another order.
MINIDL_OP(conv2d_bwd_weights_bias_pooled)
    .inputs({"dy", "argmax", "x"})
    .outputs({"dw", "dbias"})
    .attr<ir::Ints>("stride", ir::Ints{1, 1})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<ir::Ints>("kernel")
    .attr<ir::Ints>("pool_kernel")
    .attr<ir::Ints>("pool_stride")
    .attr<ir::Ints>("pool_pad", ir::Ints{0, 0})
    .infer(infer_bwd_weights_pooled)
    .flops(conv_flops)
    .kernel_factory(ir::Backend::Native, "native", make_pooled_wgrad, pooled_wgrad_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
    .kernel_factory(ir::Backend::Native, "native", make_direct_pooled_wgrad,
                    direct_pooled_wgrad_supports)
    .layout_aware()
    .bf16_values()
    .no_grad("backward-only op; second derivatives are not supported");

// max_pool2d(conv2d(x, w, bias)) in one node, the convolution's output never written whole: a
// convolution whose output only a max pooling reads. Made by fuse-max-pool-into-convolution
// (ops/fusion.hpp) where its kernel takes the node: bf16 on AMX tiles; the bits of the AMX forward
// and the pooling as two nodes.
MINIDL_OP(conv2d_max_pool2d)
    .inputs({"x", "w", "bias?"})
    .outputs({"y", "argmax"})
    .attr<ir::Ints>("stride", ir::Ints{1, 1})
    .attr<ir::Ints>("pad", ir::Ints{0, 0})
    .attr<ir::Ints>("pool_kernel")
    .attr<ir::Ints>("pool_stride")
    .attr<ir::Ints>("pool_pad", ir::Ints{0, 0})
    // relu applied to the pooled y (max_pool2d's, marking argmax -1 where it clamps): none or relu
    .attr<std::string>("activation", "none")
    .infer(infer_pooled_forward)
    .flops(conv_flops)
    .kernel_factory(ir::Backend::Native, "native", make_pooled_forward, pooled_forward_supports)
    .layout_aware()
    .mixed_precision()
    .bf16_values()
    .no_grad("a forward fused after autograd (conv2d and max_pool2d keep the gradient rules)");

}  // namespace minidl::ops
