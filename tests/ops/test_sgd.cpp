#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<BadCase> kSgdBad = {
    {{{3}, {4}}, {}, {{"lr", 0.1}}, "input 1 has shape [4]"},
    {{{3}, {3}}, {}, {}, "missing required attribute 'lr'"},
};
MINIDL_OP_TEST(sgd, std::vector<OpCase>{}, kSgdBad)
static const std::vector<BadCase> kMomentumBad = {
    {{{3}, {3}, {2}}, {}, {{"lr", 0.1}, {"momentum", 0.9}}, "input 2 has shape [2]"},
};
MINIDL_OP_TEST(sgd_momentum, std::vector<OpCase>{}, kMomentumBad)

TEST(Sgd, UpdatesInPlace) {
  Tensor p = Tensor::from(Shape{3}, std::vector<float>{1, 2, 3});
  Tensor grad = Tensor::from(Shape{3}, std::vector<float>{0.5, -1, 2});
  ir::Graph g;
  g.add_node(ops::op("sgd"), {ops::parameter(g, "p", p), ops::parameter(g, "g", grad)},
             {{"lr", 0.1}, {"weight_decay", 0.01}});
  runtime::Executable exe(g);
  exe.run();
  for (int i = 0; i < 3; ++i) {
    const float p0 = static_cast<float>(i + 1);
    EXPECT_FLOAT_EQ(p.at(i), p0 - 0.1f * (grad.at(i) + 0.01f * p0));
  }
}

TEST(Sgd, MomentumMatchesPyTorchForm) {
  Tensor p = Tensor::from(Shape{2}, std::vector<float>{1, -1});
  Tensor grad = Tensor::from(Shape{2}, std::vector<float>{0.5, 0.25});
  Tensor v = Tensor::zeros({2});
  ir::Graph g;
  g.add_node(ops::op("sgd_momentum"),
             {ops::parameter(g, "p", p), ops::parameter(g, "g", grad), ops::state(g, "v", v)},
             {{"lr", 0.1}, {"momentum", 0.9}});
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
