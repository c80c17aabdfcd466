#include <gmock/gmock.h>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{6, 5}, {6}}).dtypes({DType::F32, DType::I32}).ints_below(5).loss_outputs({0}),
    OpCase().shapes({{1, 10}, {1}}).dtypes({DType::F32, DType::I32}).loss_outputs({0}),
    OpCase().shapes({{64, 10}, {64}}).dtypes({DType::F32, DType::I32}).loss_outputs({0}),
};
static const std::vector<BadCase> kBad = {
    {{{6, 5}, {5}}, {DType::F32, DType::I32}, {}, "expected labels [6]"},
    {{{6, 5}, {6}}, {DType::F32, DType::F32}, {}, "expected i32 labels"},
    {{{6}, {6}}, {DType::F32, DType::I32}, {}, "expected logits [N,C]"},
};
MINIDL_OP_TEST(softmax_cross_entropy, kCases, kBad)

namespace {
// Runs the loss on given logits and labels; returns {loss, probs}.
std::pair<float, std::vector<float>> run_sce(const std::vector<float>& logits, std::int64_t n,
                                             std::int64_t c, const std::vector<std::int32_t>& y) {
  ir::Graph g;
  Tensor x = Tensor::from(Shape{n, c}, logits);
  Tensor l = Tensor::from(Shape{n}, y);
  auto [loss, probs] =
      ops::softmax_cross_entropy(ops::parameter(g, "x", x), ops::parameter(g, "y", l));
  g.add_output(loss);
  g.add_output(probs);
  runtime::Executable exe(g);
  exe.run();
  const Tensor& p = exe.value(probs);
  return {exe.value(loss).at(0), std::vector<float>(p.data<float>(), p.data<float>() + p.numel())};
}
}  // namespace

TEST(SoftmaxCrossEntropy, MatchesDirectFormula) {
  auto [loss, probs] = run_sce({1, 2, 3, 0, 0, 0}, 2, 3, {2, 0});
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const double expected = 0.5 * (-std::log(std::exp(3.0) / z) - std::log(1.0 / 3.0));
  EXPECT_NEAR(loss, expected, 1e-6);
  EXPECT_NEAR(probs[0], std::exp(1.0) / z, 1e-6);
  EXPECT_NEAR(probs[3], 1.0 / 3.0, 1e-6);
}

TEST(SoftmaxCrossEntropy, StableForHugeLogits) {
  auto [loss, probs] = run_sce({1000, 0, -1000, 0}, 2, 2, {1, 0});
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 0.5 * (1000.0 + 1000.0), 1e-2);
  EXPECT_FLOAT_EQ(probs[0], 1.0f);
  EXPECT_FLOAT_EQ(probs[3], 1.0f);
}

TEST(SoftmaxCrossEntropy, LabelOutOfRangeNamesTheSample) {
  try {
    run_sce({0, 0, 0, 0}, 2, 2, {0, 7});
    FAIL() << "label 7 of 2 classes accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("label 7 of sample 1 is out of range [0, 2)"));
  }
}

static const std::vector<OpCase> kSmoothed = {
    OpCase()
        .shapes({{6, 5}, {6}})
        .dtypes({DType::F32, DType::I32})
        .ints_below(5)
        .attrs({{"label_smoothing", 0.1}})
        .loss_outputs({0}),
};
TEST(SoftmaxCrossEntropy, LabelSmoothingPassesTheHarness) {
  minidl::testing::run_op_cases("softmax_cross_entropy", kSmoothed, {});
}

// torch.nn.CrossEntropyLoss(label_smoothing=e): (1 - e) nll + e mean_j(-log p_j).
TEST(SoftmaxCrossEntropy, LabelSmoothingMatchesTheDirectFormula) {
  ir::Graph g;
  Tensor x = Tensor::from(Shape{1, 3}, std::vector<float>{1, 2, 3});
  Tensor l = Tensor::from(Shape{1}, std::vector<std::int32_t>{0});
  ir::Node* n = g.add_node(ops::op("softmax_cross_entropy"),
                           {ops::parameter(g, "x", x), ops::parameter(g, "y", l)},
                           {{"label_smoothing", 0.2}});
  g.add_output(n->output(0));
  runtime::Executable exe(g);
  exe.run();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const double nll0 = -std::log(std::exp(1.0) / z);
  double mean = 0.0;
  for (int j = 1; j <= 3; ++j) mean += -std::log(std::exp(j) / z) / 3.0;
  EXPECT_NEAR(exe.value(n->output(0)).at(0), 0.8 * nll0 + 0.2 * mean, 1e-6);
}
