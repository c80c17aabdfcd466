#include <gmock/gmock.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/native/amx_bf16.hpp"
#include "minidl/ops/native/conv16.hpp"
#include "minidl/ops/native/conv_bf16.hpp"
#include "minidl/ops/native/direct_conv.hpp"
#include "minidl/ops/native/im2col.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

#if MINIDL_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include "minidl/ops/onednn/kernels.hpp"
#endif

using namespace minidl;
using ir::Ints;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {

ir::Attrs conv_attrs(Ints stride, Ints pad) { return {{"stride", stride}, {"pad", pad}}; }
ir::Attrs conv_attrs(Ints stride, Ints pad, const char* activation) {
  return {{"stride", stride}, {"pad", pad}, {"activation", std::string(activation)}};
}

}  // namespace

// x [N,C,H,W], w [K,C,KH,KW]. Samples >= 2 spread over the threads; N = 1 runs the GEMM and
// im2col in parallel instead. 1x1 stride-1 unpadded kernels skip im2col.
static const std::vector<OpCase> kConv = {
    OpCase().shapes({{2, 3, 7, 7}, {4, 3, 3, 3}}),
    OpCase().shapes({{2, 3, 8, 8}, {5, 3, 3, 3}}).attrs(conv_attrs({1, 1}, {1, 1})),
    OpCase().shapes({{1, 1, 9, 9}, {2, 1, 3, 3}}).attrs(conv_attrs({2, 2}, {0, 0})),
    OpCase().shapes({{2, 4, 6, 6}, {3, 4, 1, 1}}),
    OpCase().shapes({{2, 4, 7, 7}, {3, 4, 1, 1}}).attrs(conv_attrs({2, 2}, {0, 0})),
    OpCase().shapes({{1, 3, 5, 5}, {2, 3, 1, 1}}).attrs(conv_attrs({1, 1}, {1, 1})),
    OpCase().shapes({{1, 2, 7, 5}, {3, 2, 3, 2}}).attrs(conv_attrs({2, 1}, {1, 0})),
    OpCase().shapes({{2, 2, 5, 8}, {2, 2, 2, 4}}).attrs(conv_attrs({1, 3}, {0, 2})),
    OpCase().shapes({{3, 1, 6, 6}, {2, 1, 5, 5}}).attrs(conv_attrs({3, 3}, {2, 2})),
    OpCase().shapes({{1, 3, 5, 5}, {2, 3, 5, 5}}),
    OpCase().shapes({{2, 2, 4, 4}, {2, 2, 3, 3}}).attrs(conv_attrs({2, 2}, {1, 1})),
    OpCase().shapes({{1, 1, 1, 1}, {1, 1, 1, 1}}),
    OpCase().shapes({{5, 3, 9, 9}, {4, 3, 3, 3}}).attrs(conv_attrs({1, 1}, {1, 1})),
    OpCase().shapes({{20, 2, 4, 4}, {3, 2, 3, 3}}).attrs(conv_attrs({1, 1}, {1, 1})),
    // Channel counts oneDNN blocks by 16 (and not), a 7x7 kernel over a 7x7 input, stride 2
    // leaving the last rows unread.
    // (144-term sums in f32 leave the finite differences a few percent of noise.)
    OpCase()
        .shapes({{2, 16, 6, 6}, {32, 16, 3, 3}})
        .attrs(conv_attrs({1, 1}, {1, 1}))
        .tolerance(5e-2),
    OpCase().shapes({{3, 17, 5, 7}, {19, 17, 3, 3}}).attrs(conv_attrs({2, 2}, {1, 0})),
    // 3x3 of stride 1 between 32 channels and more: oneDNN's Winograd kernels where the CPU has
    // them (all three passes), against the native ones; with bias and ReLU, and an output whose
    // sides are no multiple of its 4x4 tiles.
    OpCase()
        .shapes({{2, 32, 8, 8}, {32, 32, 3, 3}})
        .attrs(conv_attrs({1, 1}, {1, 1}))
        .tolerance(5e-2),
    OpCase()
        .shapes({{3, 32, 6, 7}, {48, 32, 3, 3}, {48}})
        .attrs(conv_attrs({1, 1}, {1, 1}, "relu"))
        .tolerance(5e-2),
    OpCase().shapes({{1, 4, 7, 7}, {3, 4, 7, 7}}),
    OpCase().shapes({{2, 3, 8, 8}, {4, 3, 3, 3}}).attrs(conv_attrs({2, 2}, {0, 0})),
    // Fused bias and ReLU, as the fusion pass or a user builds them: bias, bias + ReLU, ReLU.
    OpCase().shapes({{2, 3, 7, 7}, {4, 3, 3, 3}, {4}}),
    OpCase().shapes({{2, 3, 8, 8}, {5, 3, 3, 3}, {5}}).attrs(conv_attrs({1, 1}, {1, 1}, "relu")),
    OpCase().shapes({{1, 2, 7, 5}, {3, 2, 3, 2}}).attrs(conv_attrs({2, 1}, {1, 0}, "relu")),
    OpCase()
        .shapes({{3, 16, 6, 6}, {32, 16, 3, 3}, {32}})
        .attrs(conv_attrs({1, 1}, {1, 1}, "relu"))
        .tolerance(5e-2),
    OpCase().shapes({{2, 4, 6, 6}, {3, 4, 1, 1}, {3}}).attrs(conv_attrs({1, 1}, {0, 0}, "relu")),
    OpCase().shapes({{1, 3, 5, 5}, {2, 3, 5, 5}, {2}}).attrs(conv_attrs({1, 1}, {0, 0}, "relu")),
    OpCase().shapes({{20, 2, 4, 4}, {3, 2, 3, 3}, {3}}).attrs(conv_attrs({1, 1}, {1, 1}, "none")),
    // Few input channels: on AVX-512 the native forward and weight gradient are direct
    // convolutions (native/direct_conv.hpp). Output rows of one vector and a tail, of two and of
    // three vectors; filter counts that are not a multiple of 8; padding on both sides of a row;
    // a row stride; a window wider than 3 columns. (Larger outputs behind a ReLU put some
    // output within the finite-difference step of its kink: ReLU on a small one.)
    OpCase().shapes({{2, 1, 12, 20}, {8, 1, 3, 3}, {8}}),
    OpCase().shapes({{1, 1, 5, 18}, {8, 1, 3, 3}, {8}}).attrs(conv_attrs({1, 1}, {0, 0}, "relu")),
    OpCase().shapes({{2, 3, 6, 18}, {10, 3, 3, 3}}).attrs(conv_attrs({1, 1}, {1, 1})),
    OpCase().shapes({{1, 2, 7, 35}, {3, 2, 5, 4}}).attrs(conv_attrs({2, 1}, {2, 1})),
    OpCase().shapes({{3, 4, 5, 9}, {17, 4, 3, 7}, {17}}).attrs(conv_attrs({1, 1}, {1, 3})),
};
static const std::vector<BadCase> kConvBad = {
    {{{1, 3, 3, 3}, {2, 3, 5, 5}},
     {},
     {},
     "kernel 5x5 exceeds padded input 3x3; x=[1,3,3,3] w=[2,3,5,5]"},
    {{{1, 3, 3, 3}, {2, 3, 5, 5}},
     {},
     conv_attrs({1, 1}, {1, 0}),
     "kernel 5x5 exceeds padded input 5x3"},
    {{{1, 3, 8, 8}, {2, 4, 3, 3}}, {}, {}, "channel mismatch: x has 3 channels, w expects 4"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}},
     {},
     conv_attrs({0, 1}, {0, 0}),
     "stride must be positive, got [0,1]; x=[1,3,8,8] w=[2,3,3,3]"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}},
     {},
     conv_attrs({1, 1}, {-1, 0}),
     "pad must be non-negative, got [-1,0]"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}}, {}, conv_attrs({2}, {0, 0}), "stride must hold 2 values"},
    {{{3, 8, 8}, {2, 3, 3, 3}}, {}, {}, "expected x [N,C,H,W], got rank 3"},
    {{{1, 3, 8, 8}, {2, 3, 3}}, {}, {}, "expected w [K,C,KH,KW], got rank 3"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}}, {DType::F32, DType::I32}, {}, "expected f32"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}},
     {},
     conv_attrs({1, 1}, {0, 0}, "gelu"),
     "unknown activation 'gelu' (expected none or relu); x=[1,3,8,8] w=[2,3,3,3]"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}, {3}},
     {},
     {},
     "bias must be [2], one per filter; x=[1,3,8,8] w=[2,3,3,3] bias=[3]"},
    {{{1, 3, 8, 8}, {2, 3, 3, 3}, {2}},
     {DType::F32, DType::F32, DType::I32},
     {},
     "expected an f32 bias"},
    {{{1, 3, 2, 2}, {2, 3, 3, 3}, {2}},
     {},
     conv_attrs({1, 1}, {0, 0}, "relu"),
     "kernel 3x3 exceeds padded input 2x2; x=[1,3,2,2] w=[2,3,3,3] bias=[2]"},
};
MINIDL_OP_TEST(conv2d, kConv, kConvBad)

// The backward ops run in every conv2d case's gradient graph; these cases cover their own shape
// rules (a forward run and the inferred shapes; they have no gradient).
static const std::vector<OpCase> kConvBwdData = {
    OpCase()
        .shapes({{2, 4, 3, 3}, {4, 3, 3, 3}})
        .attrs({{"stride", Ints{2, 2}}, {"pad", Ints{1, 1}}, {"in_shape", Ints{2, 3, 6, 5}}}),
};
static const std::vector<BadCase> kConvBwdDataBad = {
    {{{2, 4, 3, 3}, {4, 3, 3, 3}},
     {},
     {{"stride", Ints{1, 1}}, {"pad", Ints{0, 0}}, {"in_shape", Ints{2, 3, 6, 6}}},
     "in_shape [2,3,6,6] gives output 4x4, dy is 3x3"},
    {{{2, 5, 3, 3}, {4, 3, 3, 3}},
     {},
     {{"in_shape", Ints{2, 3, 5, 5}}},
     "dy has 5 channels, w has 4 filters"},
    {{{2, 4, 3, 3}, {4, 3, 3, 3}},
     {},
     {{"in_shape", Ints{3, 3, 5, 5}}},
     "does not match dy's batch 2"},
    {{{2, 4, 3, 3}, {4, 3, 3, 3}}, {}, {{"in_shape", Ints{5, 5}}}, "in_shape must hold [N,C,H,W]"},
};
MINIDL_OP_TEST(conv2d_bwd_data, kConvBwdData, kConvBwdDataBad)

static const std::vector<OpCase> kConvBwdWeights = {
    OpCase()
        .shapes({{3, 4, 3, 3}, {3, 2, 6, 5}})
        .attrs({{"stride", Ints{2, 2}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}}),
};
static const std::vector<BadCase> kConvBwdWeightsBad = {
    {{{2, 4, 3, 3}, {2, 3, 6, 6}}, {}, {{"kernel", Ints{3, 3}}}, "x gives output 4x4, dy is 3x3"},
    {{{2, 4, 4, 4}, {3, 3, 6, 6}},
     {},
     {{"kernel", Ints{3, 3}}},
     "batch mismatch: dy has 2 samples, x has 3"},
    {{{2, 4, 4, 4}, {2, 3, 6, 6}}, {}, {{"kernel", Ints{0, 3}}}, "kernel must be positive"},
    {{{2, 4, 4, 4}, {2, 3, 2, 2}},
     {},
     {{"kernel", Ints{3, 3}}},
     "kernel 3x3 exceeds padded input 2x2"},
};
MINIDL_OP_TEST(conv2d_bwd_weights, kConvBwdWeights, kConvBwdWeightsBad)

// The weight and bias gradients in one node (fuse-bias-into-weight-gradient): every backend
// against native on both outputs, and the shapes. Chunked sums (33 samples), one sample, a
// channel count oneDNN blocks by 16, stride and padding.
static const std::vector<OpCase> kConvBwdWeightsBias = {
    OpCase()
        .shapes({{3, 4, 3, 3}, {3, 2, 6, 5}})
        .attrs({{"stride", Ints{2, 2}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}}),
    OpCase()
        .shapes({{1, 5, 7, 7}, {1, 3, 7, 7}})
        .attrs({{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}}),
    OpCase()
        .shapes({{33, 32, 6, 6}, {33, 16, 6, 6}})
        .attrs({{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}}),
    OpCase()  // Winograd's weight gradient (32 channels each way)
        .shapes({{5, 32, 7, 6}, {5, 32, 7, 6}})
        .attrs({{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}}),
    // The direct kernels' shapes (few input channels): the MNIST CNN's first layer, and 3
    // channels with padding and 17 filters.
    OpCase()
        .shapes({{3, 8, 26, 26}, {3, 1, 28, 28}})
        .attrs({{"stride", Ints{1, 1}}, {"pad", Ints{0, 0}}, {"kernel", Ints{3, 3}}}),
    OpCase()
        .shapes({{5, 17, 9, 20}, {5, 3, 9, 20}})
        .attrs({{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}}),
};
static const std::vector<BadCase> kConvBwdWeightsBiasBad = {
    {{{2, 4, 3, 3}, {2, 3, 6, 6}}, {}, {{"kernel", Ints{3, 3}}}, "x gives output 4x4, dy is 3x3"},
    {{{2, 4, 4, 4}, {3, 3, 6, 6}},
     {},
     {{"kernel", Ints{3, 3}}},
     "batch mismatch: dy has 2 samples, x has 3"},
    {{{2, 4, 4, 4}, {2, 3, 6, 6}},
     {DType::F32, DType::I32},
     {{"kernel", Ints{3, 3}}},
     "expected f32"},
    {{{2, 4, 4}, {2, 3, 6, 6}}, {}, {{"kernel", Ints{3, 3}}}, "expected dy [N,K,OH,OW]"},
};
MINIDL_OP_TEST(conv2d_bwd_weights_bias, kConvBwdWeightsBias, kConvBwdWeightsBiasBad)

namespace {

/// A conv2d node on random x and w with loss sum(y * r): runs forward and backward and returns
/// y, dx and dw.
struct ConvRun {
  Tensor x, w, r;
  Tensor y, dx, dw;
};

ConvRun run_conv(const Shape& xs, const Shape& ws, const Ints& stride, const Ints& pad,
                 const Shape& ys) {
  ConvRun c;
  const CounterRng rng(5);
  c.x = Tensor::empty(xs);
  c.w = Tensor::empty(ws);
  c.r = Tensor::empty(ys);
  rng.fill_normal(c.x, 1, 0.0f, 1.0f);
  rng.fill_normal(c.w, 2, 0.0f, 1.0f);
  rng.fill_normal(c.r, 3, 0.0f, 1.0f);
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", c.x);
  ir::Value* w = ops::parameter(g, "w", c.w);
  ir::Value* y = ops::apply("conv2d", {x, w}, conv_attrs(stride, pad));
  ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "r", c.r)));
  const auto grads = autograd::differentiate(g, loss, {x, w});
  g.add_output(y);
  for (ir::Value* v : grads) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();
  c.y = exe.value(y).clone();
  c.dx = exe.value(grads[0]).clone();
  c.dw = exe.value(grads[1]).clone();
  return c;
}

}  // namespace

// An explicit convolution against the textbook loops in double: forward, and the backward with
// dy = r (the loss is sum(y * r)). Odd sizes, a non-square kernel, stride and padding.
TEST(Conv2d, MatchesDirectConvolution) {
  const std::int64_t N = 2, C = 3, H = 7, W = 6, K = 4, KH = 3, KW = 2;
  const std::int64_t SH = 2, SW = 1, PH = 1, PW = 1;
  const std::int64_t OH = (H + 2 * PH - KH) / SH + 1, OW = (W + 2 * PW - KW) / SW + 1;
  const ConvRun c = run_conv({N, C, H, W}, {K, C, KH, KW}, {SH, SW}, {PH, PW}, {N, K, OH, OW});
  ASSERT_EQ(c.y.shape(), (Shape{N, K, OH, OW}));
  std::vector<double> y(N * K * OH * OW, 0.0), dx(N * C * H * W, 0.0), dw(K * C * KH * KW, 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const std::int64_t yi = ((n * K + k) * OH + oh) * OW + ow;
          for (std::int64_t ch = 0; ch < C; ++ch)
            for (std::int64_t r = 0; r < KH; ++r)
              for (std::int64_t s = 0; s < KW; ++s) {
                const std::int64_t ih = oh * SH - PH + r, iw = ow * SW - PW + s;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const std::int64_t xi = ((n * C + ch) * H + ih) * W + iw;
                const std::int64_t wi = ((k * C + ch) * KH + r) * KW + s;
                y[yi] += double{c.x.at(xi)} * c.w.at(wi);
                dx[xi] += double{c.r.at(yi)} * c.w.at(wi);
                dw[wi] += double{c.r.at(yi)} * c.x.at(xi);
              }
        }
  auto expect_near = [](const Tensor& got, const std::vector<double>& want, const char* what) {
    ASSERT_EQ(got.numel(), static_cast<std::int64_t>(want.size())) << what;
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got.at(static_cast<std::int64_t>(i)), want[i], 1e-4 * (1.0 + std::fabs(want[i])))
          << what << " element " << i;
    }
  };
  expect_near(c.y, y, "y");
  expect_near(c.dx, dx, "dx");
  expect_near(c.dw, dw, "dw");
}

// The weight gradient sums samples in fixed chunks in a fixed order: the same bits for any thread
// count, for the sample-parallel and the GEMM-parallel paths alike.
// The direct kernels of few input channels (1 and 3 here) too.
TEST(Conv2d, SameResultForAnyThreadCount) {
  const int saved = max_threads();
  struct Layer {
    std::int64_t c, k, size, pad;
  };
  for (const auto& [c, k, size, pad] :
       {Layer{8, 16, 12, 1}, Layer{1, 8, 28, 0}, Layer{3, 32, 18, 1}})
    for (const std::int64_t n : {1, 7, 33}) {
      SCOPED_TRACE(fmt::format("C{} N{}", c, n));
      const std::int64_t out = size + 2 * pad - 2;
      std::vector<ConvRun> runs;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        runs.push_back(
            run_conv({n, c, size, size}, {k, c, 3, 3}, {1, 1}, {pad, pad}, {n, k, out, out}));
      }
      set_num_threads(saved);
      for (std::size_t t = 1; t < runs.size(); ++t) {
        for (const auto& [a, b] :
             {std::pair{runs[0].y, runs[t].y}, std::pair{runs[0].dx, runs[t].dx},
              std::pair{runs[0].dw, runs[t].dw}}) {
          ASSERT_EQ(a.numel(), b.numel());
          EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << "threads 1 vs " << t + 1;
        }
      }
    }
}

// The fused node computes what the chain it stands for computes, relu(bias_add(conv2d(x, w), b)),
// forward and backward, on every backend: the gradient rule is exact, not only close to finite
// differences.
TEST(Conv2d, FusedBiasReluMatchesTheChain) {
  std::vector<ir::Backend> backends = {ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  const Shape xs{3, 5, 9, 8}, ws{6, 5, 3, 3}, ys{3, 6, 5, 8};
  const CounterRng rng(11);
  Tensor xt = Tensor::empty(xs), wt = Tensor::empty(ws), bt = Tensor::empty({6}),
         rt = Tensor::empty(ys);
  rng.fill_normal(xt, 1, 0.0f, 1.0f);
  rng.fill_normal(wt, 2, 0.0f, 0.3f);
  rng.fill_normal(bt, 3, 0.0f, 1.0f);
  rng.fill_normal(rt, 4, 0.0f, 1.0f);
  for (const ir::Backend backend : backends) {
    for (const bool relu : {false, true}) {
      SCOPED_TRACE(fmt::format("{} relu={}", ir::backend_name(backend), relu));
      std::vector<std::vector<Tensor>> results;
      for (const bool fused : {true, false}) {
        ir::Graph g;
        ir::Value* x = ops::parameter(g, "x", xt);
        ir::Value* w = ops::parameter(g, "w", wt);
        ir::Value* b = ops::parameter(g, "b", bt);
        ir::Value* y = nullptr;
        if (fused) {
          y = ops::apply("conv2d", {x, w, b}, conv_attrs({2, 1}, {1, 1}, relu ? "relu" : "none"));
        } else {
          y = ops::bias_add(ops::apply("conv2d", {x, w}, conv_attrs({2, 1}, {1, 1})), b);
          if (relu) y = ops::relu(y);
        }
        ASSERT_EQ(y->shape(), ys);
        ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "r", rt)));
        const auto grads = autograd::differentiate(g, loss, {x, w, b});
        g.add_output(y);
        for (ir::Value* v : grads) g.add_output(v);
        runtime::Executable exe(g, {.backend = backend});
        exe.run();
        results.push_back({exe.value(y).clone(), exe.value(grads[0]).clone(),
                           exe.value(grads[1]).clone(), exe.value(grads[2]).clone()});
      }
      const char* names[] = {"y", "dx", "dw", "db"};
      for (std::size_t t = 0; t < results[0].size(); ++t) {
        const Tensor& a = results[0][t];
        const Tensor& b = results[1][t];
        ASSERT_EQ(a.shape(), b.shape()) << names[t];
        for (std::int64_t i = 0; i < a.numel(); ++i) {
          ASSERT_NEAR(a.at(i), b.at(i), 1e-5 * (1.0 + std::fabs(b.at(i)))) << names[t] << " " << i;
        }
      }
    }
  }
}

// im2col and col2im have AVX-512 row loops for unit column stride next to the portable ones:
// both give the same bits (copies, and sums in the same order), on maps narrower than a vector,
// of whole vectors and in between, with and without padding.
TEST(Conv2d, Im2colPathsAgree) {
  if (!native::im2col_uses_avx512()) GTEST_SKIP() << "this CPU runs the portable loops only";
  struct Geom {
    std::int64_t C, H, W, K, S, P;
  };
  for (const Geom& t :
       {Geom{3, 7, 7, 3, 1, 1}, Geom{2, 16, 16, 3, 1, 1}, Geom{2, 28, 28, 3, 1, 0},
        Geom{1, 9, 40, 5, 2, 2}, Geom{4, 5, 33, 2, 1, 0}, Geom{2, 20, 20, 1, 1, 0}}) {
    native::ConvGeom g;
    g.C = t.C, g.H = t.H, g.W = t.W, g.KH = g.KW = t.K, g.SH = t.S, g.SW = 1, g.PH = g.PW = t.P;
    g.OH = native::window_out_size(g.H, g.KH, g.SH, g.PH);
    g.OW = native::window_out_size(g.W, g.KW, g.SW, g.PW);
    SCOPED_TRACE(fmt::format("C{} H{} W{} K{} S{} P{}", t.C, t.H, t.W, t.K, t.S, t.P));
    Tensor x = Tensor::empty({g.C, g.H, g.W}), cols = Tensor::empty({g.rows(), g.cols()});
    CounterRng(4).fill_normal(x, 0, 0.0f, 1.0f);
    CounterRng(4).fill_normal(cols, 1, 0.0f, 1.0f);
    std::vector<Tensor> col(2), img(2);
    for (int portable = 0; portable < 2; ++portable) {
      native::im2col_force_portable(portable == 1);
      col[portable] = Tensor::full({g.rows(), g.cols()}, 7.0f);
      img[portable] = Tensor::full({g.C, g.H, g.W}, 7.0f);
      native::im2col(g, x.data<float>(), col[portable].data<float>());
      native::col2im(g, cols.data<float>(), img[portable].data<float>());
    }
    native::im2col_force_portable(false);
    EXPECT_EQ(0, std::memcmp(col[0].raw(), col[1].raw(), col[0].nbytes())) << "im2col";
    EXPECT_EQ(0, std::memcmp(img[0].raw(), img[1].raw(), img[0].nbytes())) << "col2im";
  }
}

// conv2d + bias_add (+ relu) differentiated, then the bias gradient fused into the weight
// gradient: the fused node's dw and db against central finite differences of the loss (in
// double), on every backend, and against the unfused graph (dw the same bits on the native
// backend, whose weight-gradient loop is unchanged; db by rounding).
TEST(Conv2d, FusedBiasGradientMatchesFiniteDifferences) {
  std::vector<ir::Backend> backends = {ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  const Shape xs{5, 3, 9, 8}, ws{6, 3, 3, 3}, ys{5, 6, 5, 8};
  const CounterRng rng(21);
  Tensor xt = Tensor::empty(xs), wt = Tensor::empty(ws), bt = Tensor::empty({6}),
         rt = Tensor::empty(ys);
  rng.fill_normal(xt, 1, 0.0f, 1.0f);
  rng.fill_normal(wt, 2, 0.0f, 0.3f);
  rng.fill_normal(bt, 3, 0.0f, 1.0f);
  rng.fill_normal(rt, 4, 0.0f, 1.0f);
  for (const ir::Backend backend : backends) {
    SCOPED_TRACE(ir::backend_name(backend));
    std::vector<std::vector<Tensor>> results;
    for (const bool fuse : {true, false}) {
      ir::Graph g;
      ir::Value* x = ops::parameter(g, "x", xt);
      ir::Value* w = ops::parameter(g, "w", wt);
      ir::Value* b = ops::parameter(g, "b", bt);
      ir::Value* y = ops::bias_add(ops::apply("conv2d", {x, w}, conv_attrs({2, 1}, {1, 1})), b);
      ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "r", rt)));
      const auto grads = autograd::differentiate(g, loss, {w, b});
      g.add_output(loss);
      for (ir::Value* v : grads) g.add_output(v);
      EXPECT_EQ(ops::FuseBiasIntoWeightGradient(fuse).run(g), fuse);
      std::size_t fused_nodes = 0;
      for (const ir::Node* n : g.nodes()) fused_nodes += n->op() == "conv2d_bwd_weights_bias";
      EXPECT_EQ(fused_nodes, fuse ? 1u : 0u);
      runtime::Executable exe(g, {.backend = backend});
      exe.run();
      std::vector<Tensor> out;
      for (ir::Value* v : g.outputs()) out.push_back(exe.value(v).clone());
      if (fuse) {
        std::vector<Tensor> params{wt, bt};
        const std::vector<Tensor> analytic{out[1], out[2]};
        const autograd::GradCheckResult r = autograd::check_gradients(params, analytic, [&] {
          exe.run();
          return double{exe.value(g.outputs()[0]).at(0)};
        });
        EXPECT_TRUE(r.ok) << r.report;
        exe.run();  // the parameters are back: rerun leaves the executable as it was
      }
      results.push_back(std::move(out));
    }
    const Tensor& dw_fused = results[0][1];
    const Tensor& dw_plain = results[1][1];
    if (backend == ir::Backend::Native) {
      EXPECT_EQ(0, std::memcmp(dw_fused.raw(), dw_plain.raw(), dw_plain.nbytes()));
    }
    for (std::int64_t i = 0; i < dw_plain.numel(); ++i)
      ASSERT_NEAR(dw_fused.at(i), dw_plain.at(i), 1e-5 * (1.0 + std::fabs(dw_plain.at(i)))) << i;
    const Tensor& db_fused = results[0][2];
    const Tensor& db_plain = results[1][2];
    for (std::int64_t i = 0; i < db_plain.numel(); ++i)
      ASSERT_NEAR(db_fused.at(i), db_plain.at(i), 1e-5 * (1.0 + std::fabs(db_plain.at(i)))) << i;
  }
}

// The fused node's bias gradient sums in chunks fixed by the shapes: the same bits for any
// thread count, on the sample-parallel and the GEMM-parallel paths.
// The direct kernel of few input channels too (1 channel, 8 filters, unpadded).
TEST(Conv2d, FusedBiasGradientSameForAnyThreadCount) {
  const int saved = max_threads();
  struct Layer {
    std::int64_t c, k, size, pad;
  };
  for (const auto& [c, k, size, pad] : {Layer{8, 16, 12, 1}, Layer{1, 8, 28, 0}})
    for (const std::int64_t n : {1, 7, 33}) {
      SCOPED_TRACE(fmt::format("C{} N{}", c, n));
      const std::int64_t out = size + 2 * pad - 2;
      Tensor dy = Tensor::empty({n, k, out, out}), x = Tensor::empty({n, c, size, size});
      CounterRng(9).fill_normal(dy, 0, 0.0f, 1.0f);
      CounterRng(9).fill_normal(x, 1, 0.0f, 1.0f);
      std::vector<std::pair<Tensor, Tensor>> runs;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        ir::Graph g;
        ir::Node* node = g.add_node(
            ops::op("conv2d_bwd_weights_bias"),
            {ops::parameter(g, "dy", dy), ops::parameter(g, "x", x)},
            {{"stride", Ints{1, 1}}, {"pad", Ints{pad, pad}}, {"kernel", Ints{3, 3}}}, "fused");
        g.add_output(node->output(0));
        g.add_output(node->output(1));
        runtime::Executable exe(g, {.backend = ir::Backend::Native});
        exe.run();
        runs.emplace_back(exe.value(node->output(0)).clone(), exe.value(node->output(1)).clone());
      }
      set_num_threads(saved);
      for (std::size_t t = 1; t < runs.size(); ++t) {
        EXPECT_EQ(0, std::memcmp(runs[0].first.raw(), runs[t].first.raw(), runs[0].first.nbytes()));
        EXPECT_EQ(0,
                  std::memcmp(runs[0].second.raw(), runs[t].second.raw(), runs[0].second.nbytes()));
      }
    }
}

// The direct kernels of few input channels (native/direct_conv.hpp) against the im2col + GEMM
// path on the same node: the forward with bias and ReLU, and the fused weight and bias gradient,
// close (the sums run in another order). The MNIST CNN's and the CIFAR CNN's first layers, a row
// stride with a window wider than it is tall, and 17 filters over a 7-wide window.
TEST(Conv2d, DirectMatchesIm2col) {
  struct Layer {
    Shape x, w;
    Ints stride, pad;
    const char* activation;
  };
  const Layer layers[] = {
      {{4, 1, 28, 28}, {8, 1, 3, 3}, {1, 1}, {0, 0}, "relu"},
      {{3, 3, 32, 32}, {32, 3, 3, 3}, {1, 1}, {1, 1}, "relu"},
      {{2, 2, 9, 35}, {3, 2, 5, 4}, {2, 1}, {2, 1}, "none"},
      {{1, 4, 5, 9}, {17, 4, 3, 7}, {1, 1}, {1, 3}, "relu"},
  };
  for (const Layer& l : layers) {
    SCOPED_TRACE(fmt::format("x {} w {}", l.x.str(), l.w.str()));
    const native::ConvGeom geom = [&] {
      native::ConvGeom g;
      g.C = l.x[1], g.H = l.x[2], g.W = l.x[3], g.KH = l.w[2], g.KW = l.w[3];
      g.SH = l.stride[0], g.SW = l.stride[1], g.PH = l.pad[0], g.PW = l.pad[1];
      g.OH = native::window_out_size(g.H, g.KH, g.SH, g.PH);
      g.OW = native::window_out_size(g.W, g.KW, g.SW, g.PW);
      return g;
    }();
    if (!native::direct_conv_supports(geom, l.w[0])) GTEST_SKIP() << "no direct kernel on this CPU";
    const CounterRng rng(31);
    Tensor xt = Tensor::empty(l.x), wt = Tensor::empty(l.w), bt = Tensor::empty({l.w[0]});
    rng.fill_normal(xt, 1, 0.0f, 1.0f);
    rng.fill_normal(wt, 2, 0.0f, 0.5f);
    rng.fill_normal(bt, 3, 0.0f, 0.5f);
    std::vector<std::vector<Tensor>> results;
    for (const bool direct : {true, false}) {
      native::direct_conv_force_off(!direct);
      ir::Graph g;
      ir::Value* x = ops::parameter(g, "x", xt);
      ir::Value* w = ops::parameter(g, "w", wt);
      ir::Value* b = ops::parameter(g, "b", bt);
      ir::Value* y = ops::apply("conv2d", {x, w, b}, conv_attrs(l.stride, l.pad, l.activation));
      Tensor rt = Tensor::empty(y->shape());
      rng.fill_normal(rt, 4, 0.0f, 1.0f);
      ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "r", rt)));
      const auto grads = autograd::differentiate(g, loss, {w, b});
      g.add_output(y);
      for (ir::Value* v : grads) g.add_output(v);
      EXPECT_TRUE(ops::FuseBiasIntoWeightGradient(true).run(g));
      runtime::Executable exe(g, {.backend = ir::Backend::Native});
      exe.run();
      std::vector<Tensor> out;
      for (ir::Value* v : g.outputs()) out.push_back(exe.value(v).clone());
      results.push_back(std::move(out));
    }
    native::direct_conv_force_off(false);
    // A gradient sums thousands of terms of either sign: its rounding scales with the largest
    // sums, not with each element (an element that cancels to 0.03 may differ by 1e-5).
    const char* names[] = {"y", "dw", "db"};
    for (std::size_t t = 0; t < results[0].size(); ++t) {
      const Tensor& a = results[0][t];
      const Tensor& b = results[1][t];
      ASSERT_EQ(a.shape(), b.shape()) << names[t];
      double scale = 0.0;
      for (std::int64_t i = 0; i < b.numel(); ++i)
        scale = std::max(scale, std::fabs(b.at(i)) + 0.0);
      for (std::int64_t i = 0; i < a.numel(); ++i) {
        ASSERT_NEAR(a.at(i), b.at(i), 1e-5 * (1.0 + scale)) << names[t] << " " << i;
      }
    }
  }
}

namespace {

// [N,16,H,W] between plain NCHW and the channels-innermost order (nChw16c = nhwc for 16).
void to_channels_last(const Tensor& plain, const Tensor& t) {
  const Shape& s = plain.shape();
  const std::int64_t hw = s[2] * s[3];
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t p = 0; p < hw; ++p)
        static_cast<float*>(t.raw())[(n * hw + p) * s[1] + c] =
            plain.data<float>()[(n * s[1] + c) * hw + p];
}
Tensor from_channels_last(const Tensor& t) {
  const Shape& s = t.shape();
  const std::int64_t hw = s[2] * s[3];
  Tensor plain = Tensor::empty(s);
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t p = 0; p < hw; ++p)
        plain.data<float>()[(n * s[1] + c) * hw + p] =
            static_cast<const float*>(t.raw())[(n * hw + p) * s[1] + c];
  return plain;
}

struct Conv16Run {
  std::vector<Tensor> out;  // y (bias, ReLU), dx, dw; plain
  std::string kernels;
};

// The three convolution nodes of x [N,16,H,W] and dy on w [16,16,3,3] (stride 1, padding 1),
// with x, dy, y and dx in `layout` ("" plain), on the preferred backend `backend`.
Conv16Run run_conv16(const Tensor& x, const Tensor& dy, const Tensor& w, const Tensor& b,
                     const std::string& layout, ir::Backend backend) {
  ir::Graph g;
  ir::Value* xv = ops::input(g, "x", x.shape());
  ir::Value* dyv = ops::input(g, "dy", dy.shape());
  ir::Value* wv = ops::input(g, "w", w.shape());
  ir::Value* bv = ops::input(g, "b", b.shape());
  ir::Value* y = ops::apply("conv2d", {xv, wv, bv}, conv_attrs({1, 1}, {1, 1}, "relu"));
  ir::Value* dx =
      ops::apply("conv2d_bwd_data", {dyv, wv},
                 {{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"in_shape", x.shape().dims()}});
  ir::Value* dw = ops::apply("conv2d_bwd_weights", {dyv, xv},
                             {{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}});
  for (ir::Value* v : {xv, dyv, y, dx}) v->set_layout(layout);
  for (ir::Value* v : {y, dx, dw}) g.add_output(v);
  runtime::Executable exe(g, {.backend = backend});
  const bool blocked = !layout.empty();
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"x", &x}, {"dy", &dy}}) {
    if (blocked) {
      to_channels_last(*t, exe.input(name));
    } else {
      std::memcpy(exe.input(name).raw(), t->raw(), t->nbytes());
    }
  }
  std::memcpy(exe.input("w").raw(), w.raw(), w.nbytes());
  std::memcpy(exe.input("b").raw(), b.raw(), b.nbytes());
  exe.run();
  Conv16Run r;
  r.kernels = exe.kernel_table();
  r.out.push_back(blocked ? from_channels_last(exe.value(y)) : exe.value(y).clone());
  r.out.push_back(blocked ? from_channels_last(exe.value(dx)) : exe.value(dx).clone());
  r.out.push_back(exe.value(dw).clone());
  return r;
}

}  // namespace

// The 16-channel kernels (native/conv16.hpp) on channels-innermost values against im2col and the
// GEMM on plain ones: the forward with bias and ReLU, the data and the weight gradient, close
// (their sums run in another order); a full block of 16 columns with a tail of 3, rows of one,
// two and 16 columns, one row, 9 samples (two weight-gradient chunks). Each runs the same bits on
// 1 and 2 threads. They decline other layouts and geometries, saying why.
TEST(Conv2d, SixteenChannelKernelsMatchIm2col) {
  const Shape shapes[] = {
      {3, 16, 5, 19}, {2, 16, 1, 1}, {2, 16, 4, 16}, {9, 16, 7, 2}, {1, 16, 1, 5}};
  {
    native::ConvGeom probe;
    probe.C = 16, probe.H = probe.W = probe.OH = probe.OW = 4;
    probe.KH = probe.KW = 3, probe.PH = probe.PW = 1;
    if (!native::conv16_supports(probe, 16)) GTEST_SKIP() << "no 16-channel kernel on this CPU";
  }
  const CounterRng rng(47);
  for (const Shape& s : shapes) {
    SCOPED_TRACE(fmt::format("x {}", s.str()));
    Tensor x = Tensor::empty(s), dy = Tensor::empty(s), w = Tensor::empty({16, 16, 3, 3}),
           b = Tensor::empty({16});
    rng.fill_normal(x, 1, 0.0f, 1.0f);
    rng.fill_normal(dy, 2, 0.0f, 1.0f);
    rng.fill_normal(w, 3, 0.0f, 0.3f);
    rng.fill_normal(b, 4, 0.0f, 0.3f);
    const Conv16Run ref = run_conv16(x, dy, w, b, "", ir::Backend::Native);
    EXPECT_THAT(ref.kernels, ::testing::Not(::testing::HasSubstr("native16")));
    for (const std::string layout : {"nChw16c", "nhwc"}) {
      SCOPED_TRACE(layout);
      const int saved = max_threads();
      std::vector<Conv16Run> runs;
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        runs.push_back(run_conv16(x, dy, w, b, layout, ir::Backend::Native));
      }
      set_num_threads(saved);
      const Conv16Run& got = runs[0];
      for (const char* op : {"conv2d ", "conv2d_bwd_data ", "conv2d_bwd_weights "})
        EXPECT_THAT(got.kernels, ::testing::ContainsRegex(fmt::format("{}.*native16", op)));
      const char* names[] = {"y", "dx", "dw"};
      for (std::size_t t = 0; t < got.out.size(); ++t) {
        const Tensor& a = got.out[t];
        const Tensor& e = ref.out[t];
        ASSERT_EQ(a.shape(), e.shape()) << names[t];
        ASSERT_EQ(0, std::memcmp(a.raw(), runs[1].out[t].raw(), a.nbytes()))
            << names[t] << ": 1 and 2 threads differ";
        double scale = 0.0;
        for (std::int64_t i = 0; i < e.numel(); ++i)
          scale = std::max(scale, std::fabs(e.at(i)) + 0.0);
        for (std::int64_t i = 0; i < a.numel(); ++i)
          ASSERT_NEAR(a.at(i), e.at(i), 1e-5 * (1.0 + scale)) << names[t] << " " << i;
      }
    }
  }
  // Refusals: a layout with 8 channels innermost, and a stride of 2.
  for (const auto& [layout, stride, why] :
       {std::tuple<const char*, std::int64_t, const char*>{
            "nChw8c", 1, "with its 16 channels innermost (nChw16c or nhwc), not nChw8c"},
        {"nChw16c", 2, "takes 3x3 convolutions of stride 1 and padding 1 between 16 channels"}}) {
    ir::Graph g;
    ir::Value* xv = ops::input(g, "x", Shape{2, 16, 8, 8});
    ir::Value* wv = ops::input(g, "w", Shape{16, 16, 3, 3});
    ir::Value* y = ops::apply("conv2d", {xv, wv}, conv_attrs({stride, stride}, {1, 1}));
    xv->set_layout(layout);
    y->set_layout(layout);
    const ir::KernelChoice c = ir::choose_kernel(*y->producer(), ir::Backend::Native);
    EXPECT_THAT(c.declined, ::testing::HasSubstr(why));
    EXPECT_THAT(c.declined, ::testing::HasSubstr("native16 declined"));
  }
}

#if MINIDL_WITH_ONEDNN
// oneDNN's Winograd kernels (F(4x4, 3x3), AVX-512) take the f32 3x3 convolutions of stride 1
// between at least 32 channels, the weight gradient only from 64 output channels on; 16 channels,
// stride 2 and 1x1 kernels stay direct. The op cases above compare both with the native kernels.
TEST(Conv2d, OneDnnTakesWinogradFrom32Channels) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  constexpr auto kAvx512 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core);
  const bool has_winograd = (isa & kAvx512) == kAvx512;
  struct Layer {
    std::int64_t c, k, kernel, stride;
    bool winograd;                  // forward and data gradient
    bool weight_gradient_winograd;  // from 64 output channels only
  };
  const Layer layers[] = {
      {32, 32, 3, 1, true, false},  {32, 64, 3, 1, true, true},   {64, 64, 3, 1, true, true},
      {64, 32, 3, 1, true, false},  {16, 16, 3, 1, false, false}, {16, 32, 3, 1, false, false},
      {16, 64, 3, 1, false, false}, {32, 64, 3, 2, false, false}, {32, 64, 1, 1, false, false}};
  for (const Layer& l : layers) {
    ir::Graph g;
    ir::Value* x = ops::input(g, "x", Shape{4, l.c, 8, 8});
    ir::Value* w = ops::input(g, "w", Shape{l.k, l.c, l.kernel, l.kernel});
    const std::int64_t pad = l.kernel / 2;
    ir::Value* y = ops::apply("conv2d", {x, w}, conv_attrs({l.stride, l.stride}, {pad, pad}));
    const auto grads = autograd::differentiate(g, ops::sum(y), {x, w});
    int convs = 0;
    for (const ir::Node* n : g.nodes()) {
      if (!n->def().name().starts_with("conv2d")) continue;
      ++convs;
      const bool expected = n->def().name().starts_with("conv2d_bwd_weights")
                                ? l.weight_gradient_winograd
                                : l.winograd;
      EXPECT_EQ(ops::onednn::conv2d_winograd(*n), expected && has_winograd)
          << n->describe() << " on " << l.c << " -> " << l.k << " channels, " << l.kernel << "x"
          << l.kernel << " stride " << l.stride;
    }
    EXPECT_EQ(convs, 3) << "the forward and both backward convolutions";
    (void)grads;
  }
  // The "algorithm" annotation overrides the rule both ways, and names its values when wrong.
  for (const auto& [c, algorithm] : {std::pair<std::int64_t, const char*>{32, "direct"},
                                     std::pair<std::int64_t, const char*>{16, "winograd"}}) {
    ir::Graph g;
    ir::Value* x = ops::input(g, "x", Shape{4, c, 8, 8});
    ir::Value* w = ops::input(g, "w", Shape{c, c, 3, 3});
    ir::Node* n = ops::apply("conv2d", {x, w}, conv_attrs({1, 1}, {1, 1}))->producer();
    n->annotations().set("algorithm", std::string(algorithm));
    EXPECT_EQ(ops::onednn::conv2d_winograd(*n),
              algorithm == std::string("winograd") && has_winograd)
        << c << " channels, annotated " << algorithm;
    n->annotations().set("algorithm", std::string("fft"));
    try {
      (void)ops::onednn::conv2d_winograd(*n);
      ADD_FAILURE() << "the annotation 'fft' was accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(),
                  ::testing::HasSubstr("annotation 'algorithm' must be direct or winograd"));
    }
  }
}
#endif

namespace {

/// bf16 bits of v, rounded to nearest even (the kernels' rule).
std::uint16_t bf16_bits(float v) {
  std::uint32_t u = 0;
  std::memcpy(&u, &v, sizeof u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// t with every element rounded to bf16.
Tensor bf16_rounded(const Tensor& t) {
  Tensor r = t.clone();
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    const std::uint32_t u = std::uint32_t{bf16_bits(t.at(i))} << 16;
    std::memcpy(r.data<float>() + i, &u, sizeof u);
  }
  return r;
}

/// How an activation of a bf16 weight-gradient case lies: its layout and stored type.
struct Stored {
  std::string layout;
  bool bf16 = true;
};

/// Writes the plain f32 tensor `plain` into `buffer`, a value stored as `s` says.
void store_as(const Tensor& plain, const Tensor& buffer, const Stored& s) {
  const Shape& sh = plain.shape();
  const std::int64_t ch = sh[1], sp = sh[2] * sh[3];
  const std::int64_t block = s.layout == "nhwc" ? ch : ir::channel_block(s.layout);
  for (std::int64_t n = 0; n < sh[0]; ++n)
    for (std::int64_t c = 0; c < ch; ++c)
      for (std::int64_t p = 0; p < sp; ++p) {
        const std::int64_t at = ((n * ch + c - c % block) * sp) + p * block + c % block;
        const float v = plain.at((n * ch + c) * sp + p);
        if (s.bf16) {
          static_cast<std::uint16_t*>(buffer.raw())[at] = bf16_bits(v);
        } else {
          static_cast<float*>(buffer.raw())[at] = v;
        }
      }
}

struct WgradCase {
  Shape x, dy;
  Ints kernel, pad;
  bool bias;
  Stored sx, sdy;
};

/// dw (and db) of one weight-gradient node marked bf16 on dy and x stored as the case says, on
/// `backend` (pinned); the kernel table in `kernels`.
std::vector<Tensor> run_wgrad(const WgradCase& c, const Tensor& x, const Tensor& dy,
                              ir::Precision precision, ir::Backend backend,
                              std::string* kernels = nullptr) {
  ir::Graph g;
  ir::Value* xv = ops::input(g, "x", c.x);
  ir::Value* dyv = ops::input(g, "dy", c.dy);
  ir::Node* n =
      ops::apply_node(c.bias ? "conv2d_bwd_weights_bias" : "conv2d_bwd_weights", {dyv, xv},
                      {{"stride", Ints{1, 1}}, {"pad", c.pad}, {"kernel", c.kernel}});
  n->annotations().set("precision", std::string(ir::precision_name(precision)));
  n->annotations().set("backend", std::string(ir::backend_name(backend)));
  for (auto [v, s] : {std::pair{xv, &c.sx}, std::pair{dyv, &c.sdy}}) {
    if (precision == ir::Precision::F32) continue;  // the reference: plain f32
    v->set_layout(s->layout);
    if (s->bf16) v->set_stored(DType::BF16);
  }
  for (ir::Value* out : n->outputs()) g.add_output(out);
  runtime::Executable exe(g, {.backend = backend});
  const bool plain_f32 = precision == ir::Precision::F32;
  store_as(x, exe.input("x"), plain_f32 ? Stored{"", false} : c.sx);
  store_as(dy, exe.input("dy"), plain_f32 ? Stored{"", false} : c.sdy);
  exe.run();
  if (kernels != nullptr) *kernels = exe.kernel_table();
  std::vector<Tensor> out;
  for (ir::Value* v : n->outputs()) out.push_back(exe.value(v).clone());
  return out;
}

}  // namespace

// The native bf16 weight gradient, on AMX tiles (native/conv_amx.hpp) or AVX512-BF16 dot products
// (native/conv_bf16.hpp), whichever this CPU runs, against the f32 kernel on the same
// bf16-rounded factors: equal but for the order of the f32 sums. Its inputs as --precision bf16
// keeps them (bf16 in nChw16c or nhwc, the image plain or nhwc) and as other graphs may (nChw8c,
// f32 values it rounds itself); 1 to 5 filter tiles, odd output widths (a last pair with one
// position), windows of 1x1 to 5x5 with and without padding, channels that fill no tile (A's rows
// of its own on AMX) and 16 to 48 of them (A read from the planes), positions that fill no whole
// run of 32, positions in several segments (the last two), batches of one to three chunks of
// samples; the same bits on 1 and 2 threads. The dot-product kernel declines the last three cases
// (rows of 8 and 14; an f32 image).
TEST(Conv2d, NativeBf16WeightGradientMatchesF32OnRoundedFactors) {
  const bool amx = native::amx_bf16_unavailable().empty();
  if (!amx && !native::dot_bf16_unavailable().empty())
    GTEST_SKIP() << "the native bf16 weight gradient " << native::dot_bf16_unavailable()
                 << "; AMX: " << native::amx_bf16_unavailable();
  struct Case {
    WgradCase c;
    bool dot_takes = true;
  };
  const Case cases[] = {
      // The CIFAR CNN's first and second layers, smaller.
      {{{5, 3, 6, 17}, {5, 32, 6, 17}, {3, 3}, {1, 1}, true, {"", true}, {"nChw16c", true}}},
      {{{20, 32, 4, 19}, {20, 64, 4, 19}, {3, 3}, {1, 1}, true, {"nChw16c"}, {"nChw16c"}}},
      {{{4, 32, 5, 21}, {4, 64, 5, 21}, {3, 3}, {1, 1}, true, {"nhwc"}, {"nhwc"}}},
      {{{3, 16, 5, 16}, {3, 48, 5, 16}, {5, 5}, {2, 2}, false, {"nhwc"}, {"nhwc"}}},
      {{{2, 16, 6, 18}, {2, 16, 4, 16}, {3, 3}, {0, 0}, true, {"", false}, {"", false}}},
      {{{3, 3, 7, 21}, {3, 16, 7, 21}, {3, 3}, {1, 1}, true, {"nhwc"}, {"nhwc"}}},
      {{{9, 8, 3, 16}, {9, 80, 3, 16}, {1, 1}, {0, 0}, true, {"nChw8c", true}, {"nChw16c", false}}},
      {{{3, 48, 8, 8}, {3, 32, 8, 8}, {3, 3}, {1, 1}, true, {"nhwc"}, {"nhwc"}}, false},
      {{{2, 16, 14, 14}, {2, 64, 14, 14}, {3, 3}, {1, 1}, true, {"nChw16c"}, {"nChw16c"}}, false},
      {{{2, 3, 32, 32}, {2, 32, 32, 32}, {3, 3}, {1, 1}, true, {"", false}, {"nhwc"}}, false},
  };
  const CounterRng rng(83);
  for (const auto& [c, dot_takes] : cases) {
    if (!amx && !dot_takes) continue;
    SCOPED_TRACE(
        fmt::format("x {} dy {} window {}x{} pad {} x {} {} dy {} {}", c.x.str(), c.dy.str(),
                    c.kernel[0], c.kernel[1], c.pad[0], c.sx.layout.empty() ? "plain" : c.sx.layout,
                    c.sx.bf16 ? "bf16" : "f32", c.sdy.layout.empty() ? "plain" : c.sdy.layout,
                    c.sdy.bf16 ? "bf16" : "f32"));
    Tensor x = Tensor::empty(c.x), dy = Tensor::empty(c.dy);
    rng.fill_normal(x, 1, 0.0f, 1.0f);
    rng.fill_normal(dy, 2, 0.0f, 1.0f);
    const std::vector<Tensor> want =
        run_wgrad(c, bf16_rounded(x), bf16_rounded(dy), ir::Precision::F32, ir::Backend::Native);
    const int saved = max_threads();
    std::vector<std::vector<Tensor>> got;
    std::string kernels;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      got.push_back(run_wgrad(c, x, dy, ir::Precision::BF16, ir::Backend::Native, &kernels));
    }
    set_num_threads(saved);
    EXPECT_THAT(kernels, ::testing::HasSubstr("-> native bf16"));
    ASSERT_EQ(got[0].size(), want.size());
    for (std::size_t t = 0; t < want.size(); ++t) {
      SCOPED_TRACE(t == 0 ? "dw" : "db");
      ASSERT_EQ(got[0][t].shape(), want[t].shape());
      EXPECT_EQ(0, std::memcmp(got[0][t].raw(), got[1][t].raw(), want[t].nbytes()))
          << "1 and 2 threads differ";
      double scale = 0.0;
      for (std::int64_t i = 0; i < want[t].numel(); ++i)
        scale = std::max(scale, std::fabs(want[t].at(i)) + 0.0);
      for (std::int64_t i = 0; i < want[t].numel(); ++i)
        ASSERT_NEAR(got[0][t].at(i), want[t].at(i), 1e-5 * scale) << i;
    }
  }
}

// What the native bf16 weight gradient declines, and why: f32 nodes, strides other than 1,
// filter counts that fill no tile of 16; on AVX512-BF16 dot products also output rows shorter
// than 16 and an f32 input of fewer than 16 channels, which the AMX kernel takes.
TEST(Conv2d, NativeBf16WeightGradientRefusals) {
  struct Refusal {
    Shape x, dy;
    Ints stride;
    ir::Precision precision;
    const char* why;  // "" where the kernel takes the node
  };
  const bool amx = native::amx_bf16_unavailable().empty();
  const bool available = amx || native::dot_bf16_unavailable().empty();
  const std::string why_not = native::dot_bf16_unavailable();
  const char* const missing = why_not.c_str();
  const Refusal refusals[] = {
      {{2, 16, 8, 8}, {2, 32, 8, 8}, {1, 1}, ir::Precision::F32, "computes in bf16 only"},
      {{2, 16, 8, 8},
       {2, 32, 4, 4},
       {2, 2},
       ir::Precision::BF16,
       available ? "takes stride 1 only" : missing},
      {{2, 16, 8, 8},
       {2, 32, 8, 8},
       {1, 1},
       ir::Precision::BF16,
       amx         ? ""
       : available ? "takes output rows of at least 16 positions, not 8"
                   : missing},
      {{2, 3, 8, 16},
       {2, 32, 8, 16},
       {1, 1},
       ir::Precision::BF16,
       amx         ? ""
       : available ? "of 3 channels only stored as bf16"
                   : missing},
      {{2, 16, 8, 16},
       {2, 24, 8, 16},
       {1, 1},
       ir::Precision::BF16,
       available ? "takes filter counts that are multiples of 16, not 24" : missing},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.why);
    ir::Graph g;
    ir::Value* dw =
        ops::apply("conv2d_bwd_weights", {ops::input(g, "dy", r.dy), ops::input(g, "x", r.x)},
                   {{"stride", r.stride}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}});
    dw->producer()->annotations().set("precision", std::string(ir::precision_name(r.precision)));
    dw->producer()->annotations().set("backend", std::string("native"));
    const ir::KernelChoice c = ir::choose_kernel(*dw->producer(), ir::Backend::Native);
    ASSERT_NE(c.kernel, nullptr);
    if (*r.why == '\0') {
      EXPECT_TRUE(c.kernel->bf16) << c.declined;
      continue;
    }
    EXPECT_THAT(c.declined, ::testing::HasSubstr(r.why));
    EXPECT_FALSE(c.kernel->bf16) << "the f32 kernel takes the node";
  }
}

namespace {

/// The plain f32 values of `buffer`, a value of shape `sh` stored as `s` says (store_as undone).
Tensor load_as(const Tensor& buffer, const Shape& sh, const Stored& s) {
  Tensor plain = Tensor::empty(sh);
  const std::int64_t ch = sh[1], sp = sh[2] * sh[3];
  const std::int64_t block = s.layout == "nhwc" ? ch : ir::channel_block(s.layout);
  for (std::int64_t n = 0; n < sh[0]; ++n)
    for (std::int64_t c = 0; c < ch; ++c)
      for (std::int64_t p = 0; p < sp; ++p) {
        const std::int64_t at = ((n * ch + c - c % block) * sp) + p * block + c % block;
        float v = 0.0f;
        if (s.bf16) {
          const std::uint32_t u = std::uint32_t{static_cast<const std::uint16_t*>(buffer.raw())[at]}
                                  << 16;
          std::memcpy(&v, &u, sizeof v);
        } else {
          v = static_cast<const float*>(buffer.raw())[at];
        }
        plain.data<float>()[(n * ch + c) * sp + p] = v;
      }
  return plain;
}

struct AmxConvCase {
  bool data_grad;
  Shape in, w;  // x (the forward) or dy (the data gradient); w [K, C, KH, KW]
  Ints pad;
  bool bias, relu;
  Stored s_in, s_out;
};

/// The output of one conv2d (conv2d_bwd_data) node: marked bf16 with its input and output stored
/// as the case says, or the plain f32 reference; the kernel table in `kernels`.
Tensor run_amx_conv(const AmxConvCase& c, const Tensor& in, const Tensor& w, const Tensor& b,
                    ir::Precision precision, std::string* kernels = nullptr) {
  ir::Graph g;
  ir::Value* iv = ops::input(g, "in", c.in);
  ir::Value* wv = ops::input(g, "w", c.w);
  ir::Node* n = nullptr;
  if (c.data_grad) {
    const Shape x{c.in[0], c.w[1], c.in[2] + c.w[2] - 1 - 2 * c.pad[0],
                  c.in[3] + c.w[3] - 1 - 2 * c.pad[1]};
    n = ops::apply_node("conv2d_bwd_data", {iv, wv},
                        {{"stride", Ints{1, 1}}, {"pad", c.pad}, {"in_shape", x.dims()}});
  } else {
    std::vector<ir::Value*> inputs{iv, wv};
    if (c.bias) inputs.push_back(ops::input(g, "b", {c.w[0]}));
    n = ops::apply_node("conv2d", inputs,
                        {{"stride", Ints{1, 1}},
                         {"pad", c.pad},
                         {"activation", std::string(c.relu ? "relu" : "none")}});
  }
  n->annotations().set("precision", std::string(ir::precision_name(precision)));
  n->annotations().set("backend", std::string("native"));
  const bool f32 = precision == ir::Precision::F32;
  if (!f32)
    for (auto [v, s] : {std::pair{iv, &c.s_in}, std::pair{n->output(0), &c.s_out}}) {
      v->set_layout(s->layout);
      if (s->bf16) v->set_stored(DType::BF16);
    }
  g.add_output(n->output(0));
  runtime::Executable exe(g, {.backend = ir::Backend::Native});
  store_as(in, exe.input("in"), f32 ? Stored{"", false} : c.s_in);
  Tensor(exe.input("w")).copy_from(w);
  if (c.bias && !c.data_grad) Tensor(exe.input("b")).copy_from(b);
  exe.run();
  if (kernels != nullptr) *kernels = exe.kernel_table();
  return load_as(exe.value(n->output(0)), n->output(0)->shape(), f32 ? Stored{"", false} : c.s_out);
}

}  // namespace

// The forward and the data gradient on AMX tiles (native/conv_amx.hpp) against the f32 kernel on
// the same bf16-rounded input and weights: equal but for the order of the f32 sums and the output
// rounded to bf16. The CIFAR CNN's first layer (3 channels in nhwc, with bias) and second
// layer's data gradient (64 channels of dy, six runs per window row), smaller; output rows that
// fill no chunk of 16 positions (21, 17, 10, 12), 1 to 4 tiles of output channels, windows of 1x1
// to 5x5 and 3x7, the data gradient's turned padding (0 -> 2), ReLU, outputs in nhwc, nChw16c and
// plain; plain inputs of 2 to 4 channels, whose rows are interleaved 32 positions at a time (rows
// of 10, 33 and 40); the same bits on 1 and 2 threads.
TEST(Conv2d, AmxBf16ForwardAndDataGradientMatchF32OnRoundedFactors) {
  if (const std::string why = native::amx_bf16_unavailable(); !why.empty())
    GTEST_SKIP() << "the AMX convolution " << why;
  const AmxConvCase cases[] = {
      {false, {3, 3, 9, 21}, {32, 3, 3, 3}, {1, 1}, true, false, {"nhwc"}, {"nhwc"}},
      {false, {2, 3, 32, 32}, {16, 3, 3, 3}, {1, 1}, false, true, {"nhwc"}, {"nChw16c"}},
      {false, {2, 2, 7, 10}, {48, 2, 5, 5}, {2, 2}, true, true, {""}, {"nhwc"}},
      {false, {2, 4, 6, 18}, {64, 4, 3, 7}, {1, 3}, true, false, {"nhwc"}, {""}},
      {false, {2, 3, 5, 40}, {16, 3, 3, 3}, {1, 1}, true, true, {""}, {"nhwc"}},
      {false, {1, 4, 4, 33}, {32, 4, 3, 3}, {1, 1}, false, false, {""}, {""}},
      {true, {3, 64, 9, 17}, {64, 32, 3, 3}, {1, 1}, false, false, {"nhwc"}, {"nhwc"}},
      {true, {2, 16, 6, 6}, {16, 48, 3, 3}, {0, 0}, false, false, {"nChw16c"}, {"nhwc"}},
      {true, {2, 16, 5, 12}, {16, 16, 1, 1}, {0, 0}, false, false, {"nhwc"}, {""}},
  };
  const CounterRng rng(89);
  for (const AmxConvCase& c : cases) {
    SCOPED_TRACE(fmt::format("{} in {} w {} pad {} {} in {} out {}",
                             c.data_grad ? "data gradient" : "forward", c.in.str(), c.w.str(),
                             c.pad[0], c.pad[1], c.s_in.layout.empty() ? "plain" : c.s_in.layout,
                             c.s_out.layout.empty() ? "plain" : c.s_out.layout));
    Tensor in = Tensor::empty(c.in), w = Tensor::empty(c.w), b = Tensor::empty({c.w[0]});
    rng.fill_normal(in, 1, 0.0f, 1.0f);
    rng.fill_normal(w, 2, 0.0f, 0.2f);
    rng.fill_normal(b, 3, 0.0f, 1.0f);
    const Tensor want = run_amx_conv(c, bf16_rounded(in), bf16_rounded(w), b, ir::Precision::F32);
    const int saved = max_threads();
    std::vector<Tensor> got;
    std::string kernels;
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      got.push_back(run_amx_conv(c, in, w, b, ir::Precision::BF16, &kernels));
    }
    set_num_threads(saved);
    EXPECT_THAT(kernels, ::testing::HasSubstr("-> native bf16"));
    ASSERT_EQ(got[0].shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(got[0].raw(), got[1].raw(), want.nbytes()))
        << "1 and 2 threads differ";
    double scale = 0.0;
    for (std::int64_t i = 0; i < want.numel(); ++i)
      scale = std::max(scale, std::fabs(want.at(i)) + 0.0);
    for (std::int64_t i = 0; i < want.numel(); ++i)
      ASSERT_NEAR(got[0].at(i), want.at(i), std::fabs(want.at(i)) / 128.0 + 1e-5 * scale) << i;
  }
}

// What the AMX forward and data gradient decline, and why: f32 nodes, strides other than 1,
// output channels that fill no tile of 16, activations stored as f32, and forward window rows of
// 32 values or more (oneDNN's forward is faster there).
TEST(Conv2d, AmxBf16ForwardAndDataGradientRefusals) {
  const bool amx = native::amx_bf16_unavailable().empty();
  struct Refusal {
    bool data_grad;
    Shape in, w;
    Ints stride;
    ir::Precision precision;
    bool bf16_values;
    const char* why;  // "" where the kernel takes the node
  };
  const std::string why_not = native::amx_bf16_unavailable();
  const char* const missing = why_not.c_str();
  const Refusal refusals[] = {
      {false,
       {2, 3, 8, 8},
       {16, 3, 3, 3},
       {1, 1},
       ir::Precision::F32,
       true,
       "computes in bf16 only"},
      {false, {2, 3, 8, 8}, {16, 3, 3, 3}, {1, 1}, ir::Precision::BF16, true, amx ? "" : missing},
      {true, {2, 32, 8, 8}, {32, 16, 3, 3}, {1, 1}, ir::Precision::BF16, true, amx ? "" : missing},
      {false,
       {2, 3, 8, 8},
       {16, 3, 3, 3},
       {2, 2},
       ir::Precision::BF16,
       true,
       amx ? "takes stride 1 only" : missing},
      {false,
       {2, 3, 8, 8},
       {24, 3, 3, 3},
       {1, 1},
       ir::Precision::BF16,
       true,
       amx ? "multiples of 16, not 24" : missing},
      {true,
       {2, 32, 8, 8},
       {32, 24, 3, 3},
       {1, 1},
       ir::Precision::BF16,
       true,
       amx ? "multiples of 16, not 24" : missing},
      {false,
       {2, 3, 8, 8},
       {16, 3, 3, 3},
       {1, 1},
       ir::Precision::BF16,
       false,
       amx ? "takes activations stored as bf16 only" : missing},
      {false,
       {2, 16, 8, 8},
       {16, 16, 3, 3},
       {1, 1},
       ir::Precision::BF16,
       true,
       amx ? "window rows of 32 values or more (3 x 16)" : missing},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.why);
    ir::Graph g;
    ir::Value* iv = ops::input(g, "in", r.in);
    ir::Value* wv = ops::input(g, "w", r.w);
    ir::Node* n = nullptr;
    if (r.data_grad) {
      n = ops::apply_node("conv2d_bwd_data", {iv, wv},
                          {{"stride", r.stride},
                           {"pad", Ints{1, 1}},
                           {"in_shape", Shape{r.in[0], r.w[1], r.in[2], r.in[3]}.dims()}});
    } else {
      n = ops::apply_node("conv2d", {iv, wv}, {{"stride", r.stride}, {"pad", Ints{1, 1}}});
    }
    n->annotations().set("precision", std::string(ir::precision_name(r.precision)));
    n->annotations().set("backend", std::string("native"));
    if (r.bf16_values)
      for (ir::Value* v : {iv, n->output(0)}) {
        v->set_layout("nhwc");
        v->set_stored(DType::BF16);
      }
    const ir::KernelChoice c = ir::choose_kernel(*n, ir::Backend::Native);
    if (*r.why == '\0') {
      ASSERT_NE(c.kernel, nullptr);
      EXPECT_TRUE(c.kernel->bf16) << c.declined;
      continue;
    }
    EXPECT_THAT(c.declined, ::testing::HasSubstr(r.why));
    // Another kernel takes it: oneDNN's bf16 one, or a native f32 one.
    if (c.kernel != nullptr) {
      EXPECT_FALSE(c.kernel->backend == ir::Backend::Native && c.kernel->bf16) << c.kernel->name;
    }
  }
}

// ---- the weight gradient through a max pooling's backward
// (fuse-pool-backward-into-weight-gradient)

// Shapes only: the kernels (bf16 on AMX tiles, f32 for few input channels) are checked against
// the unfused pair and the definition below.
static const std::vector<BadCase> kPooledWgradBad = {
    {{{2, 16, 16, 16}, {2, 16, 16, 16}, {2, 3, 32, 32}},
     {DType::F32, DType::F32, DType::F32},
     {{"kernel", Ints{3, 3}},
      {"pad", Ints{1, 1}},
      {"pool_kernel", Ints{2, 2}},
      {"pool_stride", Ints{2, 2}}},
     "expected f32 dy, i32 argmax and f32 x"},
    {{{2, 16, 16, 16}, {2, 16, 16, 15}, {2, 3, 32, 32}},
     {DType::F32, DType::I32, DType::F32},
     {{"kernel", Ints{3, 3}},
      {"pad", Ints{1, 1}},
      {"pool_kernel", Ints{2, 2}},
      {"pool_stride", Ints{2, 2}}},
     "argmax [2,16,16,15] must have dy's shape [2,16,16,16]"},
    {{{2, 16, 15, 16}, {2, 16, 15, 16}, {2, 3, 32, 32}},
     {DType::F32, DType::I32, DType::F32},
     {{"kernel", Ints{3, 3}},
      {"pad", Ints{1, 1}},
      {"pool_kernel", Ints{2, 2}},
      {"pool_stride", Ints{2, 2}}},
     "the convolution's output [2,16,32,32] pools to 16x16, dy is 15x16"},
    {{{2, 16, 16, 16}, {2, 16, 16, 16}, {3, 3, 32, 32}},
     {DType::F32, DType::I32, DType::F32},
     {{"kernel", Ints{3, 3}},
      {"pad", Ints{1, 1}},
      {"pool_kernel", Ints{2, 2}},
      {"pool_stride", Ints{2, 2}}},
     "batch mismatch: dy has 2 samples, x has 3"},
    {{{2, 16, 16, 16}, {2, 16, 16, 16}, {2, 3, 32, 32}},
     {DType::F32, DType::I32, DType::F32},
     {{"kernel", Ints{3, 3}},
      {"pad", Ints{1, 1}},
      {"pool_kernel", Ints{2, 2}},
      {"pool_stride", Ints{2, 2}},
      {"pool_pad", Ints{2, 0}}},
     "pool_pad [2,0] exceeds half the pool_kernel 2x2"},
};
MINIDL_OP_TEST(conv2d_bwd_weights_bias_pooled, std::vector<OpCase>{}, kPooledWgradBad)

namespace {

struct PooledCase {
  Shape x;             // the convolution's input [N, C, H, W]
  std::int64_t K = 0;  // its filters
  Ints kernel, pad;    // its window (stride 1)
  Ints pool_kernel, pool_stride;
  Stored sx, sdy;  // x's and the pooling's gradient's (and argmax's) layout and type
};

/// The pooling's output gradient [N, K, POH, POW] and argmax for case c: each window's argmax a
/// random element of it, or -1 (a fused relu's clamp) for about one window in eight; the
/// gradient normal, with every seventh element -0 and every eleventh +0.
struct PooledInputs {
  Shape y, pooled;
  Tensor dy;
  std::vector<std::int32_t> argmax;
};

PooledInputs pooled_inputs(const PooledCase& c) {
  PooledInputs in;
  const native::ConvGeom g = native::ConvGeom{.C = c.x[1],
                                              .H = c.x[2],
                                              .W = c.x[3],
                                              .KH = c.kernel[0],
                                              .KW = c.kernel[1],
                                              .SH = 1,
                                              .SW = 1,
                                              .PH = c.pad[0],
                                              .PW = c.pad[1],
                                              .OH = c.x[2] + 2 * c.pad[0] - c.kernel[0] + 1,
                                              .OW = c.x[3] + 2 * c.pad[1] - c.kernel[1] + 1};
  in.y = Shape{c.x[0], c.K, g.OH, g.OW};
  const std::int64_t POH = (g.OH - c.pool_kernel[0]) / c.pool_stride[0] + 1,
                     POW = (g.OW - c.pool_kernel[1]) / c.pool_stride[1] + 1;
  in.pooled = Shape{c.x[0], c.K, POH, POW};
  in.dy = Tensor::empty(in.pooled);
  const CounterRng rng(91);
  rng.fill_normal(in.dy, 1, 0.0f, 1.0f);
  for (std::int64_t i = 0; i < in.dy.numel(); ++i) {
    if (i % 7 == 3) in.dy.data<float>()[i] = -0.0f;
    if (i % 11 == 5) in.dy.data<float>()[i] = 0.0f;
  }
  in.argmax.resize(static_cast<std::size_t>(in.dy.numel()));
  std::uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::int64_t>(state >> 33);
  };
  for (std::int64_t i = 0; i < in.dy.numel(); ++i) {
    const std::int64_t ow = i % POW, oh = i / POW % POH;
    const std::int64_t r = next() % c.pool_kernel[0], s = next() % c.pool_kernel[1];
    const bool clamped = next() % 8 == 0;
    in.argmax[static_cast<std::size_t>(i)] =
        clamped ? -1
                : static_cast<std::int32_t>((oh * c.pool_stride[0] + r) * g.OW +
                                            ow * c.pool_stride[1] + s);
  }
  return in;
}

/// argmax (plain [N, C, ...] i32) into `buffer`, a value in `layout`.
void store_argmax(const std::vector<std::int32_t>& plain, const Shape& sh, const Tensor& buffer,
                  const std::string& layout) {
  const std::int64_t ch = sh[1], sp = sh[2] * sh[3];
  const std::int64_t block = layout == "nhwc" ? ch : ir::channel_block(layout);
  for (std::int64_t n = 0; n < sh[0]; ++n)
    for (std::int64_t c = 0; c < ch; ++c)
      for (std::int64_t p = 0; p < sp; ++p)
        buffer.data<std::int32_t>()[((n * ch + c - c % block) * sp) + p * block + c % block] =
            plain[static_cast<std::size_t>((n * ch + c) * sp + p)];
}

/// dw and db of case c: the pooling's backward and the weight gradient as two nodes (their
/// intermediate dx stored as --precision bf16 keeps it: bf16, in the gradient's layout), or, with
/// `fuse`, after fuse-pool-backward-into-weight-gradient. `kernels`: the executable's table;
/// `precision`: the weight gradient's mark.
std::vector<Tensor> run_pooled(const PooledCase& c, const PooledInputs& in, const Tensor& x,
                               bool fuse, std::string* kernels, const char* precision = "bf16") {
  ir::Graph g;
  ir::Value* xv = ops::input(g, "x", c.x);
  ir::Value* dyv = ops::input(g, "dy", in.pooled);
  ir::Value* am = ops::input(g, "argmax", in.pooled, DType::I32);
  ir::Node* pool = ops::apply_node("max_pool2d_bwd", {dyv, am},
                                   {{"kernel", c.pool_kernel},
                                    {"stride", c.pool_stride},
                                    {"pad", Ints{0, 0}},
                                    {"in_shape", in.y.dims()}});
  ir::Node* w = ops::apply_node("conv2d_bwd_weights_bias", {pool->output(), xv},
                                {{"stride", Ints{1, 1}}, {"pad", c.pad}, {"kernel", c.kernel}});
  w->annotations().set("precision", std::string(precision));
  xv->set_layout(c.sx.layout);
  if (c.sx.bf16) xv->set_stored(DType::BF16);
  for (ir::Value* v : {dyv, am, pool->output()}) v->set_layout(c.sdy.layout);
  if (c.sdy.bf16) dyv->set_stored(DType::BF16);
  pool->output()->set_stored(DType::BF16);
  for (ir::Value* out : w->outputs()) g.add_output(out);
  if (fuse) {
    EXPECT_TRUE(ops::FusePoolBackwardIntoWeightGradient().run(g));
  }
  runtime::Executable exe(g);
  store_as(x, exe.input("x"), c.sx);
  store_as(in.dy, exe.input("dy"), c.sdy);
  store_argmax(in.argmax, in.pooled, exe.input("argmax"), c.sdy.layout);
  exe.run();
  if (kernels != nullptr) *kernels = exe.kernel_table();
  std::vector<Tensor> out;
  for (ir::Value* v : g.outputs()) out.push_back(exe.value(v).clone());
  return out;
}

}  // namespace

// The fused node against the two it replaces, bitwise, on 1 and 2 threads: the CIFAR CNN's first
// layer (smaller: the image's bf16 copy plain, the gradients nhwc bf16, 2x2 windows), its
// gradient in nChw16c and f32 (rounded as it is packed), nChw8c (8 channels to a block: the
// packing's scalar path), a convolution's output the windows do not cover whole (7x9 under 2x2:
// a last row and column of zeros), 3x3 windows and 2x2 windows 3 apart (positions between them).
// The gradients hold -0 (the pooling's backward makes it +0; the fused kernel packs it as -0,
// which changes no sum) and windows clamped by a relu.
TEST(Conv2d, PooledWeightGradientMatchesTheUnfusedPair) {
  if (const std::string why = native::amx_bf16_unavailable(); !why.empty())
    GTEST_SKIP() << "the fused kernel runs on AMX tiles only: " << why;
  const PooledCase cases[] = {
      {{4, 3, 12, 14}, 32, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {"", true}, {"nhwc", true}},
      {{3, 3, 10, 16}, 32, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {"", true}, {"nChw16c", false}},
      {{2, 16, 8, 8}, 16, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {"nhwc", true}, {"nChw8c", true}},
      {{3, 3, 9, 11}, 16, {3, 3}, {0, 0}, {2, 2}, {2, 2}, {"", true}, {"nhwc", true}},
      {{2, 3, 12, 12}, 32, {3, 3}, {1, 1}, {3, 3}, {3, 3}, {"", true}, {"nhwc", true}},
      {{2, 3, 11, 14}, 16, {3, 3}, {1, 1}, {2, 2}, {3, 3}, {"", true}, {"nhwc", true}},
  };
  const CounterRng rng(97);
  for (const PooledCase& c : cases) {
    SCOPED_TRACE(fmt::format("x {} K {} pool {}x{} stride {} dy {} {}", c.x.str(), c.K,
                             c.pool_kernel[0], c.pool_kernel[1], c.pool_stride[0],
                             c.sdy.layout.empty() ? "plain" : c.sdy.layout,
                             c.sdy.bf16 ? "bf16" : "f32"));
    const PooledInputs in = pooled_inputs(c);
    Tensor x = Tensor::empty(c.x);
    rng.fill_normal(x, 1, 0.0f, 1.0f);
    std::string unfused_kernels, fused_kernels;
    const std::vector<Tensor> want = run_pooled(c, in, x, false, &unfused_kernels);
    EXPECT_THAT(unfused_kernels, ::testing::HasSubstr("conv2d_bwd_weights_bias"));
    const int saved = max_threads();
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} thread(s)", threads));
      set_num_threads(threads);
      const std::vector<Tensor> got = run_pooled(c, in, x, true, &fused_kernels);
      EXPECT_THAT(fused_kernels, ::testing::HasSubstr("conv2d_bwd_weights_bias_pooled"));
      EXPECT_THAT(fused_kernels, ::testing::Not(::testing::HasSubstr("max_pool2d_bwd")));
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t t = 0; t < want.size(); ++t) {
        SCOPED_TRACE(t == 0 ? "dw" : "db");
        ASSERT_EQ(got[t].shape(), want[t].shape());
        EXPECT_EQ(0, std::memcmp(got[t].raw(), want[t].raw(), want[t].nbytes()));
      }
    }
    set_num_threads(saved);
  }
}

// The f32 kernel (a few input channels, on any CPU with AVX-512) against the definition in
// double: dw[k][c][r][s] = the sum over samples and windows not clamped (argmax -1) of the
// window's gradient times x at the position its argmax names, zero-padded; db[k] = the sum of
// the windows' gradients; the same bits on 1 and 2 threads. The CIFAR CNN's first layer (smaller;
// the gradient in nChw16c), gradients plain with 6 filters (four at a time, then one), the MNIST
// CNN's layer (1 channel, no padding; nhwc), x and the gradient stored as bf16, a 5x5 window (15
// values to a window row) under 3x3 windows that leave the last rows and columns uncovered, and
// 2x2 windows 3 apart.
TEST(Conv2d, PooledWeightGradientInF32MatchesItsDefinition) {
  if (!native::direct_kernels_enabled())
    GTEST_SKIP() << "the f32 kernel runs on AVX-512 only (or MINIDL_DIRECT_CONV is off)";
  const PooledCase cases[] = {
      {{4, 3, 12, 14}, 32, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {"", false}, {"nChw16c", false}},
      {{3, 3, 10, 8}, 6, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {"", false}, {"", false}},
      {{3, 1, 10, 10}, 8, {3, 3}, {0, 0}, {2, 2}, {2, 2}, {"", false}, {"nhwc", false}},
      {{2, 3, 12, 12}, 16, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {"", true}, {"nhwc", true}},
      {{2, 3, 11, 13}, 8, {5, 5}, {2, 2}, {3, 3}, {3, 3}, {"", false}, {"nChw8c", false}},
      {{2, 3, 11, 14}, 16, {3, 3}, {1, 1}, {2, 2}, {3, 3}, {"", false}, {"nChw16c", false}},
  };
  const CounterRng rng(101);
  const auto stored = [](float v, bool bf16) {
    return bf16 ? std::bit_cast<float>(std::uint32_t{bf16_bits(v)} << 16) : v;
  };
  for (const PooledCase& c : cases) {
    SCOPED_TRACE(fmt::format("x {} K {} window {}x{} pool {}x{} stride {} dy {} {}", c.x.str(), c.K,
                             c.kernel[0], c.kernel[1], c.pool_kernel[0], c.pool_kernel[1],
                             c.pool_stride[0], c.sdy.layout.empty() ? "plain" : c.sdy.layout,
                             c.sdy.bf16 ? "bf16" : "f32"));
    const PooledInputs in = pooled_inputs(c);
    Tensor x = Tensor::empty(c.x);
    rng.fill_normal(x, 1, 0.0f, 1.0f);
    const std::int64_t N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3], OW = in.y[3],
                       P = in.pooled[2] * in.pooled[3], KH = c.kernel[0], KW = c.kernel[1];
    std::vector<double> dw(static_cast<std::size_t>(c.K * C * KH * KW)), db(c.K), mag(dw.size());
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < c.K; ++k)
        for (std::int64_t q = 0; q < P; ++q) {
          const std::int64_t i = (n * c.K + k) * P + q;
          const std::int32_t a = in.argmax[static_cast<std::size_t>(i)];
          if (a < 0) continue;
          const double gv = stored(in.dy.at(i), c.sdy.bf16);
          db[static_cast<std::size_t>(k)] += gv;
          const std::int64_t oh = a / OW, ow = a % OW;
          for (std::int64_t ch = 0; ch < C; ++ch)
            for (std::int64_t r = 0; r < KH; ++r)
              for (std::int64_t s = 0; s < KW; ++s) {
                const std::int64_t h = oh - c.pad[0] + r, w = ow - c.pad[1] + s;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                const double t = gv * stored(x.at(((n * C + ch) * H + h) * W + w), c.sx.bf16);
                const auto at = static_cast<std::size_t>(((k * C + ch) * KH + r) * KW + s);
                dw[at] += t;
                mag[at] += std::abs(t);
              }
        }
    const int saved = max_threads();
    std::vector<Tensor> first;
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} thread(s)", threads));
      set_num_threads(threads);
      std::string kernels;
      const std::vector<Tensor> got = run_pooled(c, in, x, true, &kernels, "f32");
      EXPECT_THAT(kernels, ::testing::HasSubstr("conv2d_bwd_weights_bias_pooled"));
      EXPECT_THAT(kernels, ::testing::Not(::testing::HasSubstr("max_pool2d_bwd")));
      ASSERT_EQ(got.size(), 2u);
      ASSERT_EQ(got[0].shape(), (Shape{c.K, C, KH, KW}));
      for (std::size_t i = 0; i < dw.size(); ++i)
        ASSERT_NEAR(got[0].at(static_cast<std::int64_t>(i)), dw[i], 1e-5 * mag[i] + 1e-6)
            << "dw element " << i;
      for (std::int64_t k = 0; k < c.K; ++k)
        ASSERT_NEAR(got[1].at(k), db[static_cast<std::size_t>(k)], 1e-4) << "db element " << k;
      if (first.empty()) {
        first = got;
        continue;
      }
      for (std::size_t t = 0; t < got.size(); ++t)
        EXPECT_EQ(0, std::memcmp(got[t].raw(), first[t].raw(), got[t].nbytes()));
    }
    set_num_threads(saved);
  }
}

// Where the pass fuses the pair and where it leaves it apart: in bf16 where the CPU has AMX, in
// f32 where it has AVX-512 and the window rows hold at most 16 values (3 x 3 channels do, 3 x 8
// do not); never for overlapping windows or a pooling's result that another node reads too (a
// convolution's data gradient).
TEST(Conv2d, PooledWeightGradientFusesOnlyWhereItsKernelTakes) {
  const auto build = [](ir::Graph& g, const char* precision, Ints pool_stride, bool data_grad,
                        std::int64_t channels) {
    ir::Value* x = ops::input(g, "x", Shape{2, channels, 8, 8});
    const Ints pk{2, 2};
    const std::int64_t p = (8 - 2) / pool_stride[0] + 1;
    ir::Value* dy = ops::input(g, "dy", Shape{2, 16, p, p});
    ir::Value* am = ops::input(g, "argmax", Shape{2, 16, p, p}, DType::I32);
    ir::Node* pool = ops::apply_node("max_pool2d_bwd", {dy, am},
                                     {{"kernel", pk},
                                      {"stride", pool_stride},
                                      {"pad", Ints{0, 0}},
                                      {"in_shape", Ints{2, 16, 8, 8}}});
    ir::Node* w =
        ops::apply_node("conv2d_bwd_weights_bias", {pool->output(), x},
                        {{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"kernel", Ints{3, 3}}});
    w->annotations().set("precision", std::string(precision));
    for (ir::Value* out : w->outputs()) g.add_output(out);
    if (data_grad) {
      ir::Value* wt = ops::input(g, "w", Shape{16, channels, 3, 3});
      g.add_output(ops::apply(
          "conv2d_bwd_data", {pool->output(), wt},
          {{"stride", Ints{1, 1}}, {"pad", Ints{1, 1}}, {"in_shape", Ints{2, channels, 8, 8}}}));
    }
  };
  const bool amx = native::amx_bf16_unavailable().empty(),
             avx512 = native::direct_kernels_enabled();
  struct Case {
    const char* precision;
    Ints pool_stride;
    bool data_grad;
    std::int64_t channels;
    bool fuses;
  };
  for (const Case& c :
       {Case{"bf16", {2, 2}, false, 3, amx || avx512}, Case{"f32", {2, 2}, false, 3, avx512},
        Case{"f32", {2, 2}, false, 8, false}, Case{"bf16", {2, 2}, false, 16, amx},
        Case{"bf16", {1, 1}, false, 3, false}, Case{"bf16", {2, 2}, true, 3, false}}) {
    SCOPED_TRACE(fmt::format("{} pool stride {} data gradient {} channels {}", c.precision,
                             c.pool_stride[0], c.data_grad, c.channels));
    ir::Graph g;
    build(g, c.precision, c.pool_stride, c.data_grad, c.channels);
    EXPECT_EQ(ops::FusePoolBackwardIntoWeightGradient().run(g), c.fuses);
    bool pooled = false;
    for (const ir::Node* n : g.nodes()) pooled |= n->op() == "conv2d_bwd_weights_bias_pooled";
    EXPECT_EQ(pooled, c.fuses);
    EXPECT_FALSE(ops::FusePoolBackwardIntoWeightGradient(false).run(g));
  }
}

// ---- the forward through a max pooling (fuse-max-pool-into-convolution)

// Shapes only: the kernel runs bf16 on AMX tiles alone, and is checked against the unfused pair
// below.
static const std::vector<BadCase> kPooledForwardBad = {
    {{{2, 3, 32, 32}, {16, 4, 3, 3}},
     {},
     {{"pad", Ints{1, 1}}, {"pool_kernel", Ints{2, 2}}, {"pool_stride", Ints{2, 2}}},
     "channel mismatch: x has 3 channels, w expects 4"},
    {{{2, 3, 32, 32}, {16, 3, 3, 3}, {8}},
     {},
     {{"pad", Ints{1, 1}}, {"pool_kernel", Ints{2, 2}}, {"pool_stride", Ints{2, 2}}},
     "bias must be [16], one per filter"},
    {{{2, 3, 4, 4}, {16, 3, 3, 3}},
     {},
     {{"pool_kernel", Ints{3, 3}}, {"pool_stride", Ints{1, 1}}},
     "kernel 3x3 exceeds padded input 2x2"},
    {{{2, 3, 8, 8}, {16, 3, 3, 3}},
     {},
     {{"pool_kernel", Ints{2, 2}},
      {"pool_stride", Ints{2, 2}},
      {"activation", std::string("gelu")}},
     "gelu"},
};
MINIDL_OP_TEST(conv2d_max_pool2d, std::vector<OpCase>{}, kPooledForwardBad)

namespace {

struct PooledForwardCase {
  Shape x;
  std::int64_t K = 0;
  Ints pad, pool_kernel, pool_stride, pool_pad;
  std::string activation;  // of the pooling
  Stored sy;               // the pooling's output: layout and type (argmax in its layout)
};

/// y and argmax of case c: conv2d (bf16, its output stored as bf16 nhwc) and max_pool2d as two
/// nodes, or, with `fuse`, after fuse-max-pool-into-convolution.
std::vector<Tensor> run_pooled_forward(const PooledForwardCase& c, const Tensor& x, const Tensor& w,
                                       const Tensor& b, bool fuse, std::string* kernels) {
  ir::Graph g;
  ir::Value* xv = ops::input(g, "x", c.x);
  ir::Value* wv = ops::input(g, "w", w.shape());
  ir::Value* bv = ops::input(g, "b", b.shape());
  ir::Node* conv = ops::apply_node("conv2d", {xv, wv, bv}, conv_attrs({1, 1}, c.pad));
  conv->annotations().set("precision", std::string("bf16"));
  ir::Node* pool = ops::apply_node("max_pool2d", {conv->output()},
                                   {{"kernel", c.pool_kernel},
                                    {"stride", c.pool_stride},
                                    {"pad", c.pool_pad},
                                    {"activation", c.activation}});
  xv->set_stored(DType::BF16);
  conv->output()->set_layout("nhwc");
  conv->output()->set_stored(DType::BF16);
  for (ir::Value* v : pool->outputs()) v->set_layout(c.sy.layout);
  if (c.sy.bf16) pool->output(0)->set_stored(DType::BF16);
  for (ir::Value* out : pool->outputs()) g.add_output(out);
  if (fuse) {
    EXPECT_TRUE(ops::FuseMaxPoolIntoConvolution().run(g));
  }
  runtime::Executable exe(g);
  store_as(x, exe.input("x"), {"", true});
  Tensor(exe.input("w")).copy_from(w);
  Tensor(exe.input("b")).copy_from(b);
  exe.run();
  if (kernels != nullptr) *kernels = exe.kernel_table();
  std::vector<Tensor> out;
  for (ir::Value* v : g.outputs()) out.push_back(exe.value(v).clone());
  return out;
}

}  // namespace

// The fused node against the two it replaces, bitwise (y as stored, argmax), on 1 and 2 threads:
// the CIFAR CNN's first layer (smaller; 2x2 windows with the relu the pooling takes over, y nhwc
// bf16), y plain f32 (the pooling's transposing path), overlapping padded 3x3 windows without a
// relu, y in nChw16c, 64 filters (two pairs of tiles) and odd sizes, and 32 input channels (the
// second layer's window rows of 96 values, into a plain f32 y as before the flatten). Inputs with
// ties (a quarter of x zero) so that the first maximum must win, as in the pooling alone.
TEST(Conv2d, PooledForwardMatchesTheUnfusedPair) {
  if (const std::string why = native::amx_bf16_unavailable(); !why.empty())
    GTEST_SKIP() << "the fused kernel runs on AMX tiles only: " << why;
  const PooledForwardCase cases[] = {
      {{4, 3, 12, 14}, 32, {1, 1}, {2, 2}, {2, 2}, {0, 0}, "relu", {"nhwc", true}},
      {{3, 3, 10, 16}, 16, {1, 1}, {2, 2}, {2, 2}, {0, 0}, "relu", {"", false}},
      {{2, 3, 11, 9}, 32, {0, 0}, {3, 3}, {2, 2}, {1, 1}, "none", {"nhwc", true}},
      {{3, 2, 9, 13}, 64, {1, 1}, {2, 2}, {2, 2}, {0, 0}, "relu", {"nChw16c", true}},
      // The second layer's shape, smaller: 32 channels, window rows of 96 values in three runs.
      {{2, 32, 8, 10}, 64, {1, 1}, {2, 2}, {2, 2}, {0, 0}, "relu", {"", false}},
  };
  const CounterRng rng(101);
  for (const PooledForwardCase& c : cases) {
    SCOPED_TRACE(fmt::format("x {} K {} pool {}x{} stride {} pad {} {} y {} {}", c.x.str(), c.K,
                             c.pool_kernel[0], c.pool_kernel[1], c.pool_stride[0], c.pool_pad[0],
                             c.activation, c.sy.layout.empty() ? "plain" : c.sy.layout,
                             c.sy.bf16 ? "bf16" : "f32"));
    Tensor x = Tensor::empty(c.x), w = Tensor::empty(Shape{c.K, c.x[1], 3, 3}),
           b = Tensor::empty(Shape{c.K});
    rng.fill_normal(x, 1, 0.0f, 1.0f);
    rng.fill_normal(w, 2, 0.0f, 0.5f);
    rng.fill_normal(b, 3, 0.0f, 0.5f);
    for (std::int64_t i = 0; i < x.numel(); i += 4) x.data<float>()[i] = 0.0f;
    std::string kernels;
    const std::vector<Tensor> want = run_pooled_forward(c, x, w, b, false, &kernels);
    // The reference's convolution in bf16 on AMX tiles: the AMX forward, or for window rows of 32
    // values or more, which that declines, oneDNN's; on the Xeon measured both sum each output's
    // products in the same order (runs of 32, rounded once) and give the same bits.
    EXPECT_THAT(kernels,
                ::testing::ContainsRegex("conv2d 'conv2d' \\(%[0-9]+\\) -> (native|onednn) bf16"));
    const int saved = max_threads();
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} thread(s)", threads));
      set_num_threads(threads);
      const std::vector<Tensor> got = run_pooled_forward(c, x, w, b, true, &kernels);
      EXPECT_THAT(kernels, ::testing::HasSubstr("conv2d_max_pool2d"));
      ASSERT_EQ(got.size(), 2u);
      for (std::size_t t = 0; t < 2; ++t) {
        SCOPED_TRACE(t == 0 ? "y" : "argmax");
        ASSERT_EQ(got[t].shape(), want[t].shape());
        EXPECT_EQ(0, std::memcmp(got[t].raw(), want[t].raw(), want[t].nbytes()));
      }
    }
    set_num_threads(saved);
  }
}

// Where the pass leaves the pair apart: an f32 convolution, a convolution's output stored as
// f32 (the fused kernel would round it to bf16 before comparing), read by another node too, or
// with its own relu. Window rows of 32 values or more (16 channels) fuse.
TEST(Conv2d, PooledForwardFusesOnlyWhereItsKernelTakes) {
  struct Case {
    const char* precision;
    DType stored;
    bool other_reader;
    const char* conv_activation;
    std::int64_t channels;
    bool fuses;
  };
  const bool amx = native::amx_bf16_unavailable().empty();
  for (const Case& c : {Case{"bf16", DType::BF16, false, "none", 3, amx},
                        Case{"f32", DType::BF16, false, "none", 3, false},
                        Case{"bf16", DType::F32, false, "none", 3, false},
                        Case{"bf16", DType::BF16, true, "none", 3, false},
                        Case{"bf16", DType::BF16, false, "relu", 3, false},
                        Case{"bf16", DType::BF16, false, "none", 16, amx}}) {
    SCOPED_TRACE(fmt::format("{} stored {} other reader {} conv activation {} channels {}",
                             c.precision, c.stored, c.other_reader, c.conv_activation, c.channels));
    ir::Graph g;
    ir::Value* x = ops::input(g, "x", Shape{2, c.channels, 8, 8});
    ir::Value* w = ops::input(g, "w", Shape{16, c.channels, 3, 3});
    ir::Node* conv =
        ops::apply_node("conv2d", {x, w}, conv_attrs({1, 1}, {1, 1}, c.conv_activation));
    conv->annotations().set("precision", std::string(c.precision));
    x->set_stored(DType::BF16);
    conv->output()->set_stored(c.stored);
    ir::Node* pool = ops::apply_node("max_pool2d", {conv->output()},
                                     {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}});
    for (ir::Value* out : pool->outputs()) g.add_output(out);
    if (c.other_reader) g.add_output(ops::apply("relu", {conv->output()}));
    EXPECT_EQ(ops::FuseMaxPoolIntoConvolution().run(g), c.fuses);
    bool fused = false;
    for (const ir::Node* n : g.nodes()) fused |= n->op() == "conv2d_max_pool2d";
    EXPECT_EQ(fused, c.fuses);
    EXPECT_FALSE(ops::FuseMaxPoolIntoConvolution(false).run(g));
  }
}
