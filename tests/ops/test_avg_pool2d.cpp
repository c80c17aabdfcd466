#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using ir::Ints;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {

ir::Attrs pool_attrs(Ints kernel, Ints stride = {}, Ints pad = {0, 0}, bool count_pad = true) {
  return {{"kernel", kernel}, {"stride", stride}, {"pad", pad}, {"count_include_pad", count_pad}};
}

}  // namespace

static const std::vector<OpCase> kAvgPool = {
    OpCase().shapes({{2, 3, 8, 8}}).attrs(pool_attrs({2, 2})),
    OpCase().shapes({{2, 3, 7, 7}}).attrs(pool_attrs({2, 2})),
    OpCase().shapes({{1, 2, 7, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1})),
    OpCase().shapes({{1, 2, 7, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1}, false)),
    OpCase().shapes({{2, 1, 6, 5}}).attrs(pool_attrs({3, 2}, {1, 2}, {1, 0})),
    OpCase().shapes({{2, 1, 6, 5}}).attrs(pool_attrs({3, 2}, {1, 2}, {1, 1}, false)),
    OpCase().shapes({{1, 3, 5, 5}}).attrs(pool_attrs({3, 3}, {1, 1})),
    OpCase().shapes({{3, 2, 4, 4}}).attrs(pool_attrs({1, 1}, {2, 2})),
    OpCase().shapes({{1, 1, 1, 1}}).attrs(pool_attrs({1, 1})),
    OpCase().shapes({{2, 2, 5, 5}}).attrs(pool_attrs({5, 5})),
    OpCase().shapes({{4, 8, 12, 12}}).attrs(pool_attrs({2, 2})),
    OpCase().shapes({{2, 16, 9, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1})),
    OpCase().shapes({{2, 16, 9, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1}, false)),
    OpCase().shapes({{1, 1, 7, 7}}).attrs(pool_attrs({7, 7}, {1, 1}, {3, 3}, false)),
};
static const std::vector<BadCase> kAvgPoolBad = {
    {{{1, 3, 3, 3}},
     {},
     pool_attrs({6, 6}, {1, 1}, {1, 1}),
     "kernel 6x6 exceeds padded input 5x5; x=[1,3,3,3]"},
    {{{1, 3, 8, 8}},
     {},
     pool_attrs({2, 2}, {1, 1}, {0, 2}),
     "pad [0,2] exceeds half the kernel 2x2"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2}, {2, -1}), "stride must be positive, got [2,-1]"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2}, {}, {0, -1}), "pad must be non-negative"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2, 2}), "kernel must hold 2 values"},
    {{{8, 8}}, {}, pool_attrs({2, 2}), "expected 4-D input [N,C,H,W]"},
};
MINIDL_OP_TEST(avg_pool2d, kAvgPool, kAvgPoolBad)

static const std::vector<OpCase> kAvgPoolBwd = {
    OpCase()
        .shapes({{2, 3, 4, 4}})
        .attrs({{"kernel", Ints{3, 3}},
                {"stride", Ints{2, 2}},
                {"pad", Ints{1, 1}},
                {"in_shape", Ints{2, 3, 8, 8}}}),
};
static const std::vector<BadCase> kAvgPoolBwdBad = {
    {{{2, 3, 4, 4}},
     {},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 9, 7}}},
     "in_shape [2,3,9,7] pools to [2,3,4,3], not dy's shape"},
    {{{2, 3, 4, 4}},
     {},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 8}}},
     "in_shape must hold [N,C,H,W], got [2,3,8]"},
};
MINIDL_OP_TEST(avg_pool2d_bwd, kAvgPoolBwd, kAvgPoolBwdBad)

// Known values on x = 1..9 in one 3x3 plane, kernel 2x2, stride 1, pad 1 (a 4x4 output): with
// count_include_pad (PyTorch's default) every window divides by 4, without it by the number of
// real elements it covers.
TEST(AvgPool2d, CountIncludePad) {
  for (const bool count_pad : {true, false}) {
    SCOPED_TRACE(count_pad);
    ir::Graph g;
    Tensor xt = Tensor::from<float>({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
    ir::Value* x = ops::parameter(g, "x", xt);
    ir::Value* y = ops::apply("avg_pool2d", {x}, pool_attrs({2, 2}, {1, 1}, {1, 1}, count_pad));
    ir::Value* dx = autograd::differentiate(g, ops::sum(y), {x})[0];
    g.add_output(y);
    g.add_output(dx);
    runtime::Executable exe(g);
    exe.run();
    const Tensor& yt = exe.value(y);
    ASSERT_EQ(yt.shape(), (Shape{1, 1, 4, 4}));
    EXPECT_FLOAT_EQ(yt.at(0), count_pad ? 0.25f : 1.0f);   // x[0,0] alone
    EXPECT_FLOAT_EQ(yt.at(1), count_pad ? 0.75f : 1.5f);   // x[0,0..1]
    EXPECT_FLOAT_EQ(yt.at(5), 3.0f);                       // 1 2 4 5: no padding
    EXPECT_FLOAT_EQ(yt.at(15), count_pad ? 2.25f : 9.0f);  // x[2,2] alone
    const Tensor& d = exe.value(dx);
    if (count_pad) {
      // Every element lies in 4 windows, each dividing by 4.
      for (int i = 0; i < 9; ++i) EXPECT_FLOAT_EQ(d.at(i), 1.0f) << i;
    } else {
      // The corner lies in windows covering 1, 2, 2 and 4 elements.
      EXPECT_FLOAT_EQ(d.at(0), 1.0f + 0.5f + 0.5f + 0.25f);
      EXPECT_FLOAT_EQ(d.at(4), 1.0f);  // the centre: four windows of 4
    }
  }
}
