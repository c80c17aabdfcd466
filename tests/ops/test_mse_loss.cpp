#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 3}, {4, 3}}),
    OpCase().shapes({{2, 784}, {2, 784}}).constants({1}),
};
static const std::vector<BadCase> kBad = {
    {{{4, 3}, {4, 2}}, {}, {}, "does not have the input's shape"},
    {{{4}, {4}}, {DType::F32, DType::I32}, {}, "expected f32 input and target"},
};
MINIDL_OP_TEST(mse_loss, kCases, kBad)

TEST(MseLoss, IsTheMeanOfSquaredDifferences) {
  ir::Graph g;
  ir::Value* y = ops::apply(
      "mse_loss",
      {ops::parameter(g, "x", Tensor::from(Shape{2, 2}, std::vector<float>{1, 2, 3, 4})),
       ops::parameter(g, "t", Tensor::from(Shape{2, 2}, std::vector<float>{1, 0, 0, 4}))});
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_FLOAT_EQ(exe.value(y).at(0), (4.0f + 9.0f) / 4.0f);
}
