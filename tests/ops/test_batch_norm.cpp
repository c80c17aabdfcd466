// batch_norm and its backward, alone (the harness: finite differences, oneDNN against native)
// and composed with bn_stats and bn_moments as BatchNorm's training forward, whose gradients must
// be PyTorch's closed form.
#include <gtest/gtest.h>

#include <cmath>

#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {
// Input 2 is a variance: positive, away from -eps where invstd is undefined.
void positive_var(std::size_t i, Tensor& t) {
  if (i != 2) return;
  float* p = t.data<float>();
  for (std::int64_t j = 0; j < t.numel(); ++j) p[j] = 0.3f + std::fabs(p[j]);
}
}  // namespace

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{3, 4, 5, 5}, {4}, {4}, {4}, {4}}).prepared(positive_var),
    OpCase().shapes({{6, 5}, {5}, {5}, {5}, {5}}).prepared(positive_var),
    OpCase().shapes({{2, 3, 4, 4}, {3}, {3}}).prepared(positive_var),       // affine=false
    OpCase().shapes({{2, 3, 2, 3}, {3}, {3}, {3}}).prepared(positive_var),  // weight only
    OpCase()
        .shapes({{2, 16, 3, 3}, {16}, {16}, {16}, {16}})
        .attrs({{"eps", 0.1}})
        .prepared(positive_var),
    // With the ReLU fused (ops::FuseBiasActivation): oneDNN's fuse_norm_relu against native, and
    // the gradient through relu_bwd of the output.
    OpCase()
        .shapes({{3, 4, 5, 5}, {4}, {4}, {4}, {4}})
        .attrs({{"activation", std::string("relu")}})
        .prepared(positive_var),
    OpCase()
        .shapes({{6, 5}, {5}, {5}})
        .attrs({{"activation", std::string("relu")}})
        .prepared(positive_var),
    // With a residual block's sum folded in (ops::FuseResidualIntoBatchNorm): native only (oneDNN
    // declines), the residual's gradient dy, through the ReLU's mask with relu.
    OpCase().shapes({{3, 4, 5, 5}, {4}, {4}, {4}, {4}, {3, 4, 5, 5}}).prepared(positive_var),
    OpCase()
        .shapes({{2, 16, 3, 3}, {16}, {16}, {16}, {16}, {2, 16, 3, 3}})
        .attrs({{"activation", std::string("relu")}})
        .prepared(positive_var),
};
static const std::vector<BadCase> kBad = {
    {{{2, 3, 4, 4}, {4}, {3}}, {}, {}, "mean must be [3] (one per channel of x), got [4]"},
    {{{2, 3, 4, 4}, {3}, {3}, {3}, {2}}, {}, {}, "bias must be [3]"},
    {{{2, 3, 4, 4}, {3}, {3, 1}}, {}, {}, "var must be [3]"},
    {{{2, 3, 4}, {3}, {3}}, {}, {}, "expected x [N,C] or [N,C,H,W], got rank 3"},
    {{{2, 3}, {3}, {3}}, {DType::F32, DType::F32, DType::I32}, {}, "expected f32 var, got i32"},
    {{{2, 3}, {3}, {3}}, {DType::I32}, {}, "expected f32 x"},
    {{{2, 3}, {3}, {3}}, {}, {{"eps", -1.0}}, "eps must be finite and >= 0"},
    {{{2, 3}, {3}, {3}},
     {},
     {{"activation", std::string("tanh")}},
     "unknown activation 'tanh' (expected none or relu)"},
    {{{2, 3}, {3}, {3}, {3}, {3}, {3, 2}},
     {},
     {},
     "residual [3,2] and x [2,3] must have one shape"},
    {{{2, 3}, {3}, {3}, {3}, {3}, {2, 3}},
     {DType::F32, DType::F32, DType::F32, DType::F32, DType::F32, DType::I32},
     {},
     "expected an f32 residual, got i32"},
};
MINIDL_OP_TEST(batch_norm, kCases, kBad)

static const std::vector<BadCase> kBwdBad = {
    {{{2, 3, 4, 4}, {2, 3, 4, 5}, {3}, {3}}, {}, {}, "must have one shape"},
    {{{2, 3}, {2, 3}, {3}, {3}, {4}}, {}, {}, "weight must be [3]"},
};
MINIDL_OP_TEST(batch_norm_bwd, std::vector<OpCase>{}, kBwdBad)

// The fused backward ops (ops::FuseBatchNormBackward); their values are checked against
// batch_norm_bwd and bn_stats_bwd in every layout in test_layouts.cpp and in whole training
// graphs in tests/frontend/test_batch_norm.cpp.
static const std::vector<BadCase> kReduceBad = {
    {{{2, 3, 4, 4}, {2, 3, 4, 5}, {3}, {3}}, {}, {}, "must have one shape"},
    {{{2, 3}, {2, 3}, {3}, {3}, {4}}, {}, {}, "weight must be [3]"},
    {{{2, 3}, {2, 3}, {3}, {3}}, {}, {{"eps", -1.0}}, "eps must be finite and >= 0"},
    // The ReLU's mask (ops::FuseActivationBackward): y after the weight, exactly with relu.
    {{{2, 3}, {2, 3}, {3}, {3}, {3}},
     {},
     {{"activation", std::string("relu")}},
     "activation relu needs the ReLU's output y as input 5"},
    {{{2, 3}, {2, 3}, {3}, {3}, {3}, {2, 3}},
     {},
     {},
     "input y (5) masks dy only with activation relu"},
    {{{2, 3}, {2, 3}, {3}, {3}, {3}, {3, 2}},
     {},
     {{"activation", std::string("relu")}},
     "y [3,2] and dy [2,3] must have one shape"},
    {{{2, 3}, {2, 3}, {3}, {3}, {3}, {2, 3}},
     {},
     {{"activation", std::string("elu")}},
     "unknown activation 'elu'"},
};
MINIDL_OP_TEST(batch_norm_bwd_reduce, std::vector<OpCase>{}, kReduceBad)

static const std::vector<BadCase> kDataBad = {
    {{{2, 3, 4, 4}, {2, 3, 4, 5}, {3}, {3, 3}}, {}, {}, "must have one shape"},
    {{{2, 3, 4, 4}, {2, 3, 4, 4}, {3}, {3, 4}}, {}, {}, "dstats must be [3,3] to match x"},
    {{{2, 3}, {2, 3}, {4}, {3, 3}}, {}, {}, "var must be [3]"},
    {{{2, 3}, {2, 3}, {3}, {3, 3}, {2}}, {}, {}, "weight must be [3]"},
    {{{2, 3}, {2, 3}, {3}, {3, 3}},
     {DType::F32, DType::F32, DType::F32, DType::I32},
     {},
     "expected f32 dstats"},
    {{{2, 3}, {2, 3}, {3}, {3, 3}, {3}},
     {},
     {{"activation", std::string("relu")}},
     "activation relu needs the ReLU's output y as input 5"},
    {{{2, 3}, {2, 3}, {3}, {3, 3}, {3}, {2, 3}},
     {DType::F32, DType::F32, DType::F32, DType::F32, DType::F32, DType::I32},
     {{"activation", std::string("relu")}},
     "expected f32 y"},
};
MINIDL_OP_TEST(batch_norm_bwd_data, std::vector<OpCase>{}, kDataBad)

namespace {

struct Composed {
  std::vector<double> dx, dw, db;
};

// x -> bn_stats -> bn_moments -> batch_norm(w, b) -> loss = sum(y * r): the gradients autograd
// composes through bn_moments_bwd and bn_stats_bwd.
Composed composed(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r,
                  ir::Backend backend) {
  ir::Graph g;
  ir::Value* xv = ops::parameter(g, "x", x);
  ir::Value* wv = ops::parameter(g, "w", w);
  ir::Value* bv = ops::parameter(g, "b", b);
  auto [mean, var] = ops::bn_moments(ops::bn_stats(xv));
  ir::Value* y = ops::batch_norm(xv, mean, var, wv, bv);
  ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "r", r)));
  const auto grads = autograd::differentiate(g, loss, {xv, wv, bv});
  for (ir::Value* v : grads) g.add_output(v);
  runtime::Executable exe(g, {.backend = backend});
  exe.run();
  auto copy = [&](int i) {
    const Tensor& t = exe.value(grads[i]);
    return std::vector<double>(t.data<float>(), t.data<float>() + t.numel());
  };
  return {copy(0), copy(1), copy(2)};
}

}  // namespace

// PyTorch's BatchNorm backward in training mode, in double: with xhat = (x - mean) * invstd over
// the M = N*H*W elements of a channel,
//   dx = w invstd / M * (M dy - sum dy - xhat sum(dy xhat)), dw = sum dy xhat, db = sum dy.
TEST(BatchNorm, ComposedGradientIsPyTorchs) {
  for (const Shape& shape : {Shape{4, 3, 5, 5}, Shape{9, 6}}) {
    SCOPED_TRACE(shape.str());
    const std::int64_t n = shape[0], ch = shape[1], sp = shape.numel() / (n * ch), m = n * sp;
    Tensor x = Tensor::empty(shape), r = Tensor::empty(shape);
    Tensor w = Tensor::empty({ch}), b = Tensor::empty({ch});
    const CounterRng rng(3);
    rng.fill_normal(x, 0, 0.5f, 2.0f);
    rng.fill_uniform(r, 1, -1.0f, 1.0f);
    rng.fill_uniform(w, 2, 0.5f, 1.5f);
    rng.fill_uniform(b, 3, -1.0f, 1.0f);
    auto at = [&](std::int64_t i, std::int64_t c, std::int64_t s) { return (i * ch + c) * sp + s; };
    std::vector<double> dx(x.numel()), dw(ch), db(ch);
    for (std::int64_t c = 0; c < ch; ++c) {
      double mean = 0, var = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s) mean += x.at(at(i, c, s));
      mean /= m;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s) var += std::pow(x.at(at(i, c, s)) - mean, 2);
      var /= m;
      const double invstd = 1.0 / std::sqrt(var + 1e-5);
      double sdy = 0, sdyx = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s) {
          sdy += r.at(at(i, c, s));
          sdyx += r.at(at(i, c, s)) * (x.at(at(i, c, s)) - mean) * invstd;
        }
      dw[c] = sdyx;
      db[c] = sdy;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s) {
          const double xhat = (x.at(at(i, c, s)) - mean) * invstd;
          dx[at(i, c, s)] = w.at(c) * invstd / m * (m * r.at(at(i, c, s)) - sdy - xhat * sdyx);
        }
    }
    std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
    backends.push_back(ir::Backend::OneDnn);
#endif
    for (ir::Backend backend : backends) {
      const Composed got = composed(x, w, b, r, backend);
      for (std::int64_t c = 0; c < ch; ++c) {
        EXPECT_NEAR(got.dw[c], dw[c], 1e-4 * (1 + std::fabs(dw[c]))) << "channel " << c;
        EXPECT_NEAR(got.db[c], db[c], 1e-4 * (1 + std::fabs(db[c]))) << "channel " << c;
      }
      // dx is a difference of terms of order |dy|: compare at the scale of w invstd |dy|.
      for (std::int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(got.dx[i], dx[i], 2e-4) << i;
    }
  }
}
