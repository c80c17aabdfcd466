#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{3, 4}}).attrs({{"perm", ir::Ints{1, 0}}}),
    OpCase().shapes({{2, 3, 4, 5}}).attrs({{"perm", ir::Ints{0, 2, 3, 1}}}),
    OpCase().shapes({{2, 1, 4}}).attrs({{"perm", ir::Ints{1, 0, 2}}}),  // only a size-1 moves
    OpCase().shapes({{2, 3, 4}}).attrs({{"perm", ir::Ints{2, 1, 0}}}),
};
static const std::vector<BadCase> kBad = {
    {{{3, 4}},
     {},
     {{"perm", ir::Ints{0, 0}}},
     "perm [0,0] is not a permutation of the 2 dimensions of [3,4]"},
    {{{3, 4}}, {}, {{"perm", ir::Ints{0}}}, "is not a permutation"},
    {{{3, 4}}, {}, {{"perm", ir::Ints{0, 2}}}, "is not a permutation"},
};
MINIDL_OP_TEST(permute, kCases, kBad)

TEST(Permute, TransposeSwapsTwoDimensions) {
  ir::Graph g;
  Tensor x = Tensor::empty({2, 3, 4});
  for (int i = 0; i < 24; ++i) x.data<float>()[i] = static_cast<float>(i);
  ir::Value* y = ops::transpose(ops::parameter(g, "x", x), 0, -1);
  EXPECT_EQ(y->shape(), Shape({4, 3, 2}));
  EXPECT_EQ(y->producer()->attrs().get<ir::Ints>("perm"), (ir::Ints{2, 1, 0}));
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        EXPECT_EQ(exe.value(y).at(a * 6 + b * 2 + c), static_cast<float>(c * 12 + b * 4 + a));
  EXPECT_THROW(ops::transpose(y, 0, 3), Error);
}
