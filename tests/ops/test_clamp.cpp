#include <limits>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

// avoid_ties puts the 24 inputs on a grid of step 1/6 in (-2, 2); the bounds fall between grid
// points, so no finite-difference step crosses one.
static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 6}}).avoid_ties().attrs({{"min", -0.5}, {"max", 0.6}}),
    OpCase().shapes({{4, 6}}).avoid_ties().attrs({{"min", -0.5}}),
    OpCase().shapes({{4, 6}}).avoid_ties().attrs({{"max", 0.1}}),
    OpCase().shapes({{4, 6}}).avoid_ties(),
};
static const std::vector<BadCase> kBad = {
    {{{3}}, {}, {{"min", 1.0}, {"max", 0.0}}, "min 1 must not exceed max 0"},
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
};
MINIDL_OP_TEST(clamp, kCases, kBad)

static const std::vector<OpCase> kBwd = {
    OpCase()
        .shapes({{4, 6}, {4, 6}})
        .avoid_ties()
        .attrs({{"min", -0.5}, {"max", 0.6}})
        .constants({1}),
};
static const std::vector<BadCase> kBwdBad = {
    {{{3}, {4}}, {}, {}, "input 1 has shape [4], expected the shape of input 0, [3]"},
};
MINIDL_OP_TEST(clamp_bwd, kBwd, kBwdBad)

// The builder leaves an absent bound out; a bound itself passes the gradient (PyTorch's rule).
TEST(Clamp, BuilderBoundsAndValues) {
  ir::Graph g;
  Tensor x = Tensor::empty({4});
  const float v[] = {-2.0f, -1.0f, 0.5f, 3.0f};
  std::copy(v, v + 4, x.data<float>());
  ir::Value* y = ops::clamp(ops::parameter(g, "x", x), -1.0, std::nullopt);
  EXPECT_EQ(y->producer()->attrs().get<double>("max"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(y->producer()->attrs().get<double>("min"), -1.0);
}
