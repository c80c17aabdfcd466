#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/autograd/autograd.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace {
std::vector<float> values(const runtime::Executable& e, ir::Value* v) {
  const Tensor& t = e.value(v);
  return {t.data<float>(), t.data<float>() + t.numel()};
}
}  // namespace

// y = sum(x * x): x fans out to both inputs of mul, so dy/dx = 2x needs accumulation.
TEST(Autograd, FanOutAccumulates) {
  Tensor xt = Tensor::from(Shape{3}, std::vector<float>{1, -2, 3});
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Value* loss = ops::sum(ops::mul(x, x));
  auto grads = autograd::differentiate(g, loss, {x});
  g.add_output(grads[0]);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_THAT(values(exe, grads[0]), ::testing::ElementsAre(2, -4, 6));
  EXPECT_NE(g.find("x.grad_sum"), nullptr);
}

// A parameter shared by two layers receives the sum of both gradients.
TEST(Autograd, SharedParameter) {
  Tensor wt = Tensor::from(Shape{2, 2}, std::vector<float>{1, 2, 3, 4});
  Tensor xt = Tensor::from(Shape{1, 2}, std::vector<float>{1, 1});
  ir::Graph g;
  ir::Value* w = ops::parameter(g, "w", wt);
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Value* h = ops::matmul(ops::matmul(x, w, false, true), w, false, true);  // x W^T W^T
  ir::Value* loss = ops::sum(h);
  auto grads = autograd::differentiate(g, loss, {w});
  g.add_output(grads[0]);
  g.add_output(loss);
  runtime::Executable exe(g);
  exe.run();
  // Check against finite differences of the same graph.
  std::vector<Tensor> params{wt};
  std::vector<Tensor> analytic{exe.value(grads[0]).clone()};
  auto r = autograd::check_gradients(params, analytic, [&] {
    exe.run();
    return double{exe.value(loss).at(0)};
  });
  EXPECT_TRUE(r.ok) << r.report;
}

TEST(Autograd, SeveralLossesAreSummed) {
  Tensor xt = Tensor::from(Shape{2}, std::vector<float>{1, 2});
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Value* l1 = ops::sum(ops::scale(x, 3.0));
  ir::Value* l2 = ops::mean(x);
  auto grads = autograd::differentiate(g, {l1, l2}, {x});
  g.add_output(grads[0]);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_THAT(values(exe, grads[0]), ::testing::ElementsAre(3.5f, 3.5f));
}

TEST(Autograd, BackwardNodesAreMarked) {
  Tensor xt = Tensor::zeros({2, 2});
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Value* loss = ops::sum(ops::relu(x));
  autograd::differentiate(g, loss, {x});
  ir::Node* bwd = g.find("relu.bwd");
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->op(), "relu_bwd");
  EXPECT_EQ(bwd->phase(), ir::Phase::Backward);
}

TEST(Autograd, ParameterThatDoesNotReachTheLoss) {
  Tensor at = Tensor::zeros({2}), bt = Tensor::zeros({2});
  ir::Graph g;
  ir::Value* a = ops::parameter(g, "a", at);
  ir::Value* b = ops::parameter(g, "b", bt);
  ir::Value* loss = ops::sum(a);
  EXPECT_THAT(
      [&] {
        autograd::differentiate(g, loss, {a, b});
      },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("parameter 'b'")));
}

TEST(Autograd, LossMustBeScalar) {
  Tensor at = Tensor::zeros({2});
  ir::Graph g;
  ir::Value* a = ops::parameter(g, "a", at);
  EXPECT_THAT(
      [&] { autograd::differentiate(g, ops::relu(a), {a}); },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("must be a single f32 element")));
}

// The checker itself must be able to fail: a wrong analytic gradient is reported.
TEST(GradCheck, DetectsAWrongGradient) {
  Tensor x = Tensor::from(Shape{2}, std::vector<float>{1, 2});
  Tensor wrong = Tensor::from(Shape{2}, std::vector<float>{2, 5});  // d(x0^2 + x1^2) = (2, 4)
  std::vector<Tensor> params{x};
  std::vector<Tensor> analytic{wrong};
  auto r = autograd::check_gradients(
      params, analytic, [&] { return double{x.at(0)} * x.at(0) + double{x.at(1)} * x.at(1); });
  EXPECT_FALSE(r.ok);
  EXPECT_THAT(r.report, ::testing::HasSubstr("element 1"));
  EXPECT_EQ(r.report.find("element 0"), std::string::npos);
}

// A pipeline stage's backward starts from a given gradient of an inner value (received from the
// next stage), besides or instead of a loss: y = x * x with dL/dy = g gives dL/dx = 2 x g, and
// the gradient of a source that is not a parameter (a received activation) is returned too.
TEST(Autograd, SeededGradients) {
  Tensor xt = Tensor::from(Shape{3}, std::vector<float>{1, -2, 3});
  Tensor gt = Tensor::from(Shape{3}, std::vector<float>{0.5f, 1, 2});
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Value* y = ops::mul(x, x);
  ir::Value* seed = ops::parameter(g, "seed", gt);
  auto grads = autograd::differentiate(g, {}, {{y, seed}}, {x});
  g.add_output(grads[0]);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_THAT(values(exe, grads[0]), ::testing::ElementsAre(1, -4, 12));
  // A seed of the wrong shape is refused, naming both.
  ir::Graph h;
  ir::Value* a = ops::parameter(h, "a", xt);
  ir::Value* b = ops::mul(a, a);
  ir::Value* wrong = ops::parameter(h, "wrong", Tensor::from(Shape{1}, std::vector<float>{1}));
  EXPECT_THAT(
      [&] {
        autograd::differentiate(h, {}, {{b, wrong}}, {a});
      },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr("is [1] f32, the value [3] f32")));
}
