#include <cmath>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<BadCase> kBad = {
    {{{3}, {3}, {3}, {2}, {}, {}}, {{}, {}, {}, {}, {}, DType::I64}, {}, "input 3 has shape [2]"},
    {{{3}, {3}, {3}, {3}, {}, {}}, {}, {}, "input 5 (step) must be a single i64 element"},
    {{{3}, {3}, {3}, {3}, {}, {}},
     {{}, {}, {}, {}, {}, DType::I64},
     {{"beta1", 1.0}},
     "betas must lie in [0, 1)"},
};
MINIDL_OP_TEST(adamw, std::vector<OpCase>{}, kBad)

namespace {

struct AdamWRun {
  Tensor p = Tensor::from(Shape{3}, std::vector<float>{1.0f, -0.5f, 0.0f});
  Tensor m = Tensor::zeros({3}), v = Tensor::zeros({3});
  Tensor lr = Tensor::full({}, 0.01f), step = Tensor::zeros({}, DType::I64);
  Tensor grad = Tensor::zeros({3});
  ir::Graph g;
  std::unique_ptr<runtime::Executable> exe;
  AdamWRun() {
    g.add_node(ops::op("adamw"),
               {ops::parameter(g, "p", p), ops::parameter(g, "g", grad), ops::state(g, "m", m),
                ops::state(g, "v", v), ops::state(g, "lr", lr), ops::state(g, "step", step)},
               {{"weight_decay", 0.1}});
    exe = std::make_unique<runtime::Executable>(g);
  }
};

}  // namespace

// The reference: torch.optim.AdamW's single-tensor update, in double.
TEST(AdamW, MatchesTheReferenceUpdateOverSteps) {
  AdamWRun r;
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1, lr = 0.01;
  double p[3] = {1.0, -0.5, 0.0}, m[3] = {}, v[3] = {};
  const float grads[4][3] = {
      {0.1f, -0.2f, 0.3f}, {1.0f, 0.0f, -1.0f}, {0.5f, 0.5f, 0.5f}, {-2.0f, 1e-3f, 0.0f}};
  for (int t = 1; t <= 4; ++t) {
    std::copy_n(grads[t - 1], 3, r.grad.data<float>());
    *r.step.data<std::int64_t>() = t;
    r.exe->run();
    for (int i = 0; i < 3; ++i) {
      const double gi = grads[t - 1][i];
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      p[i] -= lr / (1 - std::pow(b1, t)) * m[i] / denom;
      EXPECT_NEAR(r.p.at(i), p[i], 1e-6) << "step " << t << " element " << i;
      EXPECT_NEAR(r.m.at(i), m[i], 1e-6);
      EXPECT_NEAR(r.v.at(i), v[i], 1e-7);
    }
  }
}

TEST(AdamW, RefusesStepZero) {
  AdamWRun r;
  *r.step.data<std::int64_t>() = 0;
  EXPECT_THROW(r.exe->run(), Error);
}

// A tensor long enough for the vectorised body of every thread's range and its tail: each element
// as the double-precision reference after three steps, with gradient scaling (clipping) too.
TEST(AdamW, LongTensorsMatchTheReference) {
  constexpr std::int64_t kN = 4099;
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05, lr = 0.003, scale = 0.5;
  Tensor p = Tensor::zeros({kN}), grad = Tensor::zeros({kN});
  Tensor m = Tensor::zeros({kN}), v = Tensor::zeros({kN});
  Tensor lr_t = Tensor::full({}, static_cast<float>(lr)), step = Tensor::zeros({}, DType::I64);
  Tensor scale_t = Tensor::full({}, static_cast<float>(scale));
  std::vector<double> rp(kN), rm(kN, 0.0), rv(kN, 0.0);
  for (std::int64_t i = 0; i < kN; ++i) {
    p.data<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    rp[i] = p.data<float>()[i];
  }
  ir::Graph g;
  g.add_node(ops::op("adamw"),
             {ops::parameter(g, "p", p), ops::parameter(g, "g", grad), ops::state(g, "m", m),
              ops::state(g, "v", v), ops::state(g, "lr", lr_t), ops::state(g, "step", step),
              ops::state(g, "scale", scale_t)},
             {{"weight_decay", wd}});
  runtime::Executable exe(g);
  for (int t = 1; t <= 3; ++t) {
    for (std::int64_t i = 0; i < kN; ++i)
      grad.data<float>()[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i * t)));
    *step.data<std::int64_t>() = t;
    exe.run();
    for (std::int64_t i = 0; i < kN; ++i) {
      const double gi = scale * grad.data<float>()[i];
      rp[i] *= 1.0 - lr * wd;
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      rp[i] -= lr / (1 - std::pow(b1, t)) * rm[i] /
               (std::sqrt(rv[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
    }
  }
  for (std::int64_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(p.at(i), rp[i], 1e-6) << "element " << i;
    ASSERT_NEAR(m.at(i), rm[i], 1e-6) << "element " << i;
    ASSERT_NEAR(v.at(i), rv[i], 1e-7) << "element " << i;
  }
}
