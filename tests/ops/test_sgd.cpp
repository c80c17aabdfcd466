#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <vector>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<BadCase> kSgdBad = {
    {{{3}, {4}, {}}, {}, {}, "input 1 has shape [4]"},
    {{{3}, {3}, {2}}, {}, {}, "input 2 (lr) must be a single f32 element"},
    {{{3}, {3}}, {}, {}, "expected 3 to 4 inputs"},
};
MINIDL_OP_TEST(sgd, std::vector<OpCase>{}, kSgdBad)
static const std::vector<BadCase> kMomentumBad = {
    {{{3}, {3}, {2}, {}}, {}, {{"momentum", 0.9}}, "input 2 has shape [2]"},
    {{{3}, {3}, {3}, {}, {3}}, {}, {{"momentum", 0.9}}, "input 4 (grad_scale) must be a single"},
};
MINIDL_OP_TEST(sgd_momentum, std::vector<OpCase>{}, kMomentumBad)

namespace {
ir::Value* scalar(ir::Graph& g, const std::string& name, float v) {
  return ops::state(g, name, Tensor::full({}, v));
}
}  // namespace

TEST(Sgd, UpdatesInPlace) {
  Tensor p = Tensor::from(Shape{3}, std::vector<float>{1, 2, 3});
  Tensor grad = Tensor::from(Shape{3}, std::vector<float>{0.5, -1, 2});
  ir::Graph g;
  g.add_node(ops::op("sgd"),
             {ops::parameter(g, "p", p), ops::parameter(g, "g", grad), scalar(g, "lr", 0.1f)},
             {{"weight_decay", 0.01}});
  runtime::Executable exe(g);
  exe.run();
  for (int i = 0; i < 3; ++i) {
    const float p0 = static_cast<float>(i + 1);
    EXPECT_FLOAT_EQ(p.at(i), p0 - 0.1f * (grad.at(i) + 0.01f * p0));
  }
}

TEST(Sgd, GradScaleMultipliesTheGradient) {
  Tensor p = Tensor::from(Shape{2}, std::vector<float>{1, 2});
  Tensor grad = Tensor::from(Shape{2}, std::vector<float>{4, -8});
  ir::Graph g;
  g.add_node(ops::op("sgd"), {ops::parameter(g, "p", p), ops::parameter(g, "g", grad),
                              scalar(g, "lr", 0.5f), scalar(g, "s", 0.25f)});
  runtime::Executable exe(g);
  exe.run();
  EXPECT_FLOAT_EQ(p.at(0), 1.0f - 0.5f * 1.0f);
  EXPECT_FLOAT_EQ(p.at(1), 2.0f + 0.5f * 2.0f);
}

TEST(Sgd, MomentumMatchesPyTorchForm) {
  Tensor p = Tensor::from(Shape{2}, std::vector<float>{1, -1});
  Tensor grad = Tensor::from(Shape{2}, std::vector<float>{0.5, 0.25});
  Tensor v = Tensor::zeros({2});
  ir::Graph g;
  g.add_node(ops::op("sgd_momentum"),
             {ops::parameter(g, "p", p), ops::parameter(g, "g", grad), ops::state(g, "v", v),
              scalar(g, "lr", 0.1f)},
             {{"momentum", 0.9}});
  runtime::Executable exe(g);
  exe.run();
  exe.run();
  // v1 = g, p1 = p0 - lr g; v2 = 0.9 g + g, p2 = p1 - lr v2.
  for (int i = 0; i < 2; ++i) {
    const float g0 = grad.at(i);
    const float p0 = i == 0 ? 1.0f : -1.0f;
    EXPECT_FLOAT_EQ(v.at(i), 1.9f * g0);
    EXPECT_NEAR(p.at(i), p0 - 0.1f * g0 - 0.1f * 1.9f * g0, 1e-6);
  }
}

TEST(Sgd, NesterovMatchesPyTorchForm) {
  Tensor p = Tensor::from(Shape{1}, std::vector<float>{1});
  Tensor grad = Tensor::from(Shape{1}, std::vector<float>{0.5});
  Tensor v = Tensor::zeros({1});
  ir::Graph g;
  g.add_node(ops::op("sgd_momentum"),
             {ops::parameter(g, "p", p), ops::parameter(g, "g", grad), ops::state(g, "v", v),
              scalar(g, "lr", 0.1f)},
             {{"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.1}});
  runtime::Executable exe(g);
  // PyTorch: d = g + wd p; buf = mu buf + d; p -= lr (d + mu buf), in double here.
  double pd = 1.0, buf = 0.0;
  for (int step = 0; step < 3; ++step) {
    exe.run();
    const double d = 0.5 + 0.1 * pd;
    buf = 0.9 * buf + d;
    pd -= 0.1 * (d + 0.9 * buf);
    EXPECT_NEAR(p.at(0), pd, 1e-6) << "step " << step;
    EXPECT_NEAR(v.at(0), buf, 1e-6) << "step " << step;
  }
}

TEST(Sgd, LongTensorsGiveTheScalarRuleBitForBit) {
  // 4099 elements: the vector loops (AVX-512 or AVX2 clones where the CPU has them) and their
  // tails. Each update must equal the same arithmetic done one element at a time in f32 without
  // fused multiply-adds (this file is built for the baseline, which has none), bit for bit: a
  // clone that contracted a multiply-add would round differently.
  constexpr std::int64_t kN = 4099;
  const float lr = 0.03f, wd = 0.01f, s = 0.5f, mu = 0.9f;
  for (const char* rule : {"sgd", "momentum", "nesterov"}) {
    SCOPED_TRACE(rule);
    const bool momentum = std::string_view(rule) != "sgd";
    const bool nesterov = std::string_view(rule) == "nesterov";
    Tensor p = Tensor::zeros({kN}), grad = Tensor::zeros({kN}), v = Tensor::zeros({kN});
    std::vector<float> rp(kN), rv(kN, 0.0f);
    for (std::int64_t i = 0; i < kN; ++i)
      rp[i] = p.data<float>()[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    ir::Graph g;
    std::vector<ir::Value*> in{ops::parameter(g, "p", p), ops::parameter(g, "g", grad)};
    if (momentum) in.push_back(ops::state(g, "v", v));
    in.push_back(scalar(g, "lr", lr));
    in.push_back(scalar(g, "s", s));
    ir::Attrs attrs{{"weight_decay", double{wd}}};
    if (momentum) {
      attrs.set("momentum", double{mu});
      attrs.set("nesterov", nesterov);
    }
    g.add_node(ops::op(momentum ? "sgd_momentum" : "sgd"), in, attrs);
    runtime::Executable exe(g);
    for (int t = 1; t <= 3; ++t) {
      for (std::int64_t i = 0; i < kN; ++i)
        grad.data<float>()[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i * t)));
      exe.run();
      for (std::int64_t i = 0; i < kN; ++i) {
        const float gi = grad.data<float>()[i];
        if (!momentum) {
          rp[i] -= lr * (s * gi + wd * rp[i]);
        } else if (nesterov) {
          const float d = s * gi + wd * rp[i];
          rv[i] = mu * rv[i] + d;
          rp[i] -= lr * (d + mu * rv[i]);
        } else {
          rv[i] = mu * rv[i] + (s * gi + wd * rp[i]);
          rp[i] -= lr * rv[i];
        }
      }
    }
    for (std::int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(p.at(i)), std::bit_cast<std::uint32_t>(rp[i]))
          << "element " << i << ": " << p.at(i) << " against " << rp[i];
      if (momentum) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(v.at(i)), std::bit_cast<std::uint32_t>(rv[i]))
            << "element " << i;
      }
    }
  }
}
