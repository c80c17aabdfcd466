#include <cmath>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 3}, {4, 3}}),
    OpCase().shapes({{8}, {8}}).constants({1}),
};
static const std::vector<BadCase> kBad = {
    {{{4, 3}, {3}}, {}, {}, "does not have the logits' shape"},
};
MINIDL_OP_TEST(bce_with_logits, kCases, kBad)

TEST(BceWithLogits, MatchesTheDirectFormulaAndStaysFinite) {
  ir::Graph g;
  ir::Value* y = ops::apply(
      "bce_with_logits",
      {ops::parameter(g, "x", Tensor::from(Shape{3}, std::vector<float>{0.5f, -1.0f, 200.0f})),
       ops::parameter(g, "t", Tensor::from(Shape{3}, std::vector<float>{1.0f, 0.0f, 0.0f}))});
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  // -log s(0.5) - log(1 - s(-1)) + 200 (log(1 + e^200) is 200 to double precision).
  const double want = (-std::log(sig(0.5)) - std::log(1.0 - sig(-1.0)) + 200.0) / 3.0;
  EXPECT_NEAR(exe.value(y).at(0), want, 1e-4);
}
