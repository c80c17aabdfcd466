#include <limits>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static ir::Attrs slice_attrs(std::int64_t axis, std::int64_t start, std::int64_t end,
                             std::int64_t step = 1) {
  return {{"axis", axis}, {"start", start}, {"end", end}, {"step", step}};
}

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{5, 3}}).attrs(slice_attrs(0, 1, 4)),
    OpCase().shapes({{2, 7, 3}}).attrs(slice_attrs(1, 0, 7, 3)),
    OpCase().shapes({{2, 7, 3}}).attrs(slice_attrs(-1, -2, 100)),
    OpCase().shapes({{6}}).attrs({{"start", std::int64_t{2}}}),  // to the end
};
static const std::vector<BadCase> kBad = {
    {{{5, 3}}, {}, slice_attrs(0, 1, 4, 0), "step must be at least 1, got 0"},
    {{{5, 3}}, {}, slice_attrs(2, 0, 1), "axis 2 is out of range for rank 2"},
    {{{5, 3}}, {}, slice_attrs(0, 3, 1), "the slice 3:1:1 of axis 0 (size 5) is empty"},
    {{{5, 3}}, {}, slice_attrs(1, 7, 9), "the slice 7:9:1 of axis 1 (size 3) is empty"},
};
MINIDL_OP_TEST(slice, kCases, kBad)

static ir::Attrs bwd_attrs(ir::Ints shape, std::int64_t axis, std::int64_t start, std::int64_t end,
                           std::int64_t step = 1) {
  ir::Attrs a = slice_attrs(axis, start, end, step);
  a.set("shape", std::move(shape));
  return a;
}
static const std::vector<OpCase> kBwd = {
    OpCase().shapes({{2, 3, 3}}).attrs(bwd_attrs({2, 7, 3}, 1, 0, 7, 3)),
};
static const std::vector<BadCase> kBwdBad = {
    {{{2, 2}},
     {},
     bwd_attrs({2, 7, 3}, 1, 0, 7, 3),
     "dy has shape [2,2], expected the slice's [2,3,3]"},
};
MINIDL_OP_TEST(slice_bwd, kBwd, kBwdBad)

TEST(Slice, ValuesWithAStep) {
  ir::Graph g;
  Tensor x = Tensor::empty({2, 5});
  for (int i = 0; i < 10; ++i) x.data<float>()[i] = static_cast<float>(i);
  ir::Value* y = ops::slice(ops::parameter(g, "x", x), -1, 1, 5, 2);
  EXPECT_EQ(y->shape(), Shape({2, 2}));
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  const float want[] = {1, 3, 6, 8};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(exe.value(y).at(i), want[i]);
}
