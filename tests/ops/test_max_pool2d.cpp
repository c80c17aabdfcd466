#include <gmock/gmock.h>

#include <cmath>
#include <limits>

#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using ir::Ints;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {

ir::Attrs pool_attrs(Ints kernel, Ints stride = {}, Ints pad = {0, 0}) {
  return {{"kernel", kernel}, {"stride", stride}, {"pad", pad}};
}

}  // namespace

// Finite differences are meaningless where the maximum is not unique: inputs are distinct.
static const std::vector<OpCase> kMaxPool = {
    OpCase().shapes({{2, 3, 8, 8}}).attrs(pool_attrs({2, 2})).avoid_ties(),
    OpCase().shapes({{2, 3, 7, 7}}).attrs(pool_attrs({2, 2})).avoid_ties(),
    OpCase().shapes({{1, 2, 7, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1})).avoid_ties(),
    OpCase().shapes({{2, 1, 6, 5}}).attrs(pool_attrs({3, 2}, {1, 2}, {1, 0})).avoid_ties(),
    OpCase().shapes({{1, 3, 5, 5}}).attrs(pool_attrs({3, 3}, {1, 1})).avoid_ties(),
    OpCase().shapes({{3, 2, 4, 4}}).attrs(pool_attrs({1, 1}, {2, 2})).avoid_ties(),
    OpCase().shapes({{1, 1, 1, 1}}).attrs(pool_attrs({1, 1})).avoid_ties(),
    OpCase().shapes({{2, 2, 5, 5}}).attrs(pool_attrs({5, 5})).avoid_ties(),
    OpCase().shapes({{4, 8, 12, 12}}).attrs(pool_attrs({2, 2})).avoid_ties(),
    OpCase().shapes({{2, 16, 9, 9}}).attrs(pool_attrs({3, 3}, {2, 2}, {1, 1})).avoid_ties(),
    OpCase().shapes({{1, 1, 7, 7}}).attrs(pool_attrs({7, 7}, {1, 1}, {3, 3})).avoid_ties(),
};
static const std::vector<BadCase> kMaxPoolBad = {
    {{{1, 3, 3, 3}}, {}, pool_attrs({6, 6}, {1, 1}, {1, 1}), "kernel 6x6 exceeds padded input 5x5"},
    {{{1, 3, 3, 3}}, {}, pool_attrs({4, 2}), "kernel 4x2 exceeds padded input 3x3; x=[1,3,3,3]"},
    {{{1, 3, 8, 8}},
     {},
     pool_attrs({2, 2}, {1, 1}, {2, 0}),
     "pad [2,0] exceeds half the kernel 2x2"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2}, {0, 1}), "stride must be positive, got [0,1]"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2, 2}, {}, {-1, 0}), "pad must be non-negative"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({0, 2}), "kernel must be positive, got [0,2]"},
    {{{1, 3, 8, 8}}, {}, pool_attrs({2}), "kernel must hold 2 values"},
    {{{3, 8, 8}}, {}, pool_attrs({2, 2}), "expected 4-D input [N,C,H,W]"},
    {{{1, 3, 8, 8}}, {DType::I32}, pool_attrs({2, 2}), "expected f32 x"},
};
MINIDL_OP_TEST(max_pool2d, kMaxPool, kMaxPoolBad)

// argmax is drawn at random, so the window is the whole plane: every index is one a forward
// could have chosen (oneDNN's backward can only route dy inside each window).
static const std::vector<OpCase> kMaxPoolBwd = {
    OpCase()
        .shapes({{2, 3, 1, 1}, {2, 3, 1, 1}})
        .dtypes({DType::F32, DType::I32})
        .ints_below(64)
        .attrs({{"kernel", Ints{8, 8}}, {"in_shape", Ints{2, 3, 8, 8}}}),
};
static const std::vector<BadCase> kMaxPoolBwdBad = {
    {{{2, 3, 4, 4}, {2, 3, 4, 4}},
     {DType::F32, DType::I32},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 9, 7}}},
     "in_shape [2,3,9,7] pools to [2,3,4,3], not dy's shape"},
    {{{2, 3, 4, 4}, {2, 3, 4, 4}},
     {DType::F32, DType::F32},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 8, 8}}},
     "expected f32 dy and i32 argmax"},
    {{{2, 3, 4, 4}, {2, 3, 4, 3}},
     {DType::F32, DType::I32},
     {{"kernel", Ints{2, 2}}, {"in_shape", Ints{2, 3, 8, 8}}},
     "argmax must have dy's shape"},
};
MINIDL_OP_TEST(max_pool2d_bwd, kMaxPoolBwd, kMaxPoolBwdBad)

// Known values: the first maximum wins a tie, argmax is ih * W + iw within the plane, padding
// never wins (it is -inf, not 0), and the backward adds dy where overlapping windows share it.
TEST(MaxPool2d, KnownValuesAndIndices) {
  ir::Graph g;
  // One 3x4 plane.
  Tensor xt = Tensor::from<float>({1, 1, 3, 4}, {-1, 2, 2, 2,   //
                                                 -3, -2, 0, 9,  //
                                                 -4, -6, 1, -7});
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Node* n = ops::apply_node(
      "max_pool2d", {x}, {{"kernel", Ints{2, 2}}, {"stride", Ints{1, 2}}, {"pad", Ints{1, 1}}});
  ir::Value* dx = autograd::differentiate(g, ops::sum(n->output(0)), {x})[0];
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  g.add_output(dx);
  runtime::Executable exe(g);
  exe.run();
  // OH = (3 + 2 - 2) / 1 + 1 = 4, OW = (4 + 2 - 2) / 2 + 1 = 3.
  const Tensor& y = exe.value(n->output(0));
  const Tensor& am = exe.value(n->output(1));
  ASSERT_EQ(y.shape(), (Shape{1, 1, 4, 3}));
  const std::vector<float> want_y = {-1, 2, 2, -1, 2, 9, -3, 1, 9, -4, 1, -7};
  const std::vector<std::int32_t> want_am = {0, 1, 3, 0, 1, 7, 4, 10, 7, 8, 10, 11};
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(y.at(i), want_y[i]) << i;
    EXPECT_EQ(am.data<std::int32_t>()[i], want_am[i]) << i;
  }
  // d sum(y) / dx counts the windows that picked each element.
  const std::vector<float> want_dx = {2, 2, 0, 1, 1, 0, 0, 2, 1, 0, 2, 1};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(exe.value(dx).at(i), want_dx[i]) << i;
}

// The CNNs' 2x2 window with stride 2: a window of -inf picks its first element; a NaN wins over
// numbers, and a later NaN over an earlier one (as in PyTorch); the first of equal maxima wins.
TEST(MaxPool2d, TwoByTwoWindowsKeepTheRules) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  ir::Graph g;
  Tensor xt = Tensor::from<float>({1, 1, 2, 6}, {-inf, -inf, 1, nan, 5, 5,  //
                                                 -inf, -inf, nan, 1, 5, 5});
  ir::Node* n = ops::apply_node("max_pool2d", {ops::parameter(g, "x", xt)},
                                {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}});
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  runtime::Executable exe(g, {.backend = ir::Backend::Native});
  exe.run();
  const Tensor& y = exe.value(n->output(0));
  const std::int32_t* am = exe.value(n->output(1)).data<std::int32_t>();
  EXPECT_EQ(y.at(0), -inf);
  EXPECT_TRUE(std::isnan(y.at(1)));
  EXPECT_EQ(y.at(2), 5.0f);
  EXPECT_EQ(am[0], 0);
  EXPECT_EQ(am[1], 8);  // the second NaN, row 1 column 2
  EXPECT_EQ(am[2], 4);
}

// The harness compares f32 outputs only; argmax (i32) must agree exactly between the backends,
// since max_pool2d_bwd on either reads the other's. The inputs here are small integers, so many
// windows hold ties: both backends pick the first maximum in window order.
TEST(MaxPool2d, BackendsAgreeOnArgmaxAndTies) {
#if !MINIDL_WITH_ONEDNN
  GTEST_SKIP() << "built without oneDNN (MINIDL_WITH_ONEDNN=OFF)";
#endif
  struct Case {
    Shape x;
    ir::Attrs attrs;
  };
  const std::vector<Case> cases = {
      {{2, 3, 8, 8}, pool_attrs({2, 2})},
      {{2, 3, 7, 7}, pool_attrs({2, 2})},
      {{1, 2, 7, 9}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {{2, 1, 6, 5}, pool_attrs({3, 2}, {1, 2}, {1, 0})},
      {{1, 3, 5, 5}, pool_attrs({3, 3}, {1, 1})},
      {{3, 2, 4, 4}, pool_attrs({1, 1}, {2, 2})},
      {{2, 2, 5, 5}, pool_attrs({5, 5})},
      {{4, 32, 16, 16}, pool_attrs({2, 2})},
      {{2, 16, 9, 9}, pool_attrs({3, 3}, {2, 2}, {1, 1})},
      {{1, 1, 20, 20}, pool_attrs({17, 17}, {1, 1}, {8, 8})},  // a window of > 255 taps
  };
  for (const Case& c : cases) {
    for (const std::int64_t levels : {3, 1000000}) {  // many ties, next to none
      SCOPED_TRACE(fmt::format("x={} levels={}", c.x, levels));
      Tensor xt = Tensor::empty(c.x);
      const CounterRng rng(3);
      for (std::int64_t i = 0; i < xt.numel(); ++i)
        xt.data<float>()[i] = static_cast<float>(rng.bits(1, i) % levels);
      ir::Graph g;
      ir::Value* x = ops::parameter(g, "x", xt);
      ir::Node* n = ops::apply_node("max_pool2d", {x}, c.attrs);
      Tensor rt = Tensor::empty(n->output(0)->shape());
      rng.fill_normal(rt, 2, 0.0f, 1.0f);
      ir::Value* loss = ops::sum(ops::mul(n->output(0), ops::parameter(g, "r", rt)));
      ir::Value* dx = autograd::differentiate(g, loss, {x})[0];
      g.add_output(n->output(0));
      g.add_output(n->output(1));
      g.add_output(dx);
      runtime::Executable native(g, {.backend = ir::Backend::Native});
      runtime::Executable onednn(g, {.backend = ir::Backend::OneDnn});
      ASSERT_THAT(onednn.kernel_table(), ::testing::HasSubstr("max_pool2d_bwd"));
      native.run();
      onednn.run();
      const Tensor& am_n = native.value(n->output(1));
      const Tensor& am_o = onednn.value(n->output(1));
      for (std::int64_t i = 0; i < am_n.numel(); ++i) {
        ASSERT_EQ(am_n.data<std::int32_t>()[i], am_o.data<std::int32_t>()[i]) << "argmax " << i;
        ASSERT_EQ(native.value(n->output(0)).at(i), onednn.value(n->output(0)).at(i)) << "y " << i;
      }
      for (std::int64_t i = 0; i < xt.numel(); ++i)
        ASSERT_NEAR(native.value(dx).at(i), onednn.value(dx).at(i), 1e-5) << "dx " << i;
    }
  }
}

// oneDNN's backward routes dy through a workspace, which can only name taps of each window: an
// argmax outside its window (no forward produces one) is refused with the node named.
TEST(MaxPool2d, OneDnnBackwardRefusesArgmaxOutsideItsWindow) {
#if !MINIDL_WITH_ONEDNN
  GTEST_SKIP() << "built without oneDNN (MINIDL_WITH_ONEDNN=OFF)";
#endif
  ir::Graph g;
  ir::Value* dy = ops::parameter(g, "dy", Tensor::full({1, 1, 2, 2}, 1.0f));
  // Plane 4x4, 2x2 windows: output (0, 1) reads columns 2..3 of rows 0..1; index 4 is (1, 0).
  Tensor am = Tensor::from<std::int32_t>({1, 1, 2, 2}, {0, 4, 8, 10});
  ir::Value* dx = ops::apply("max_pool2d_bwd", {dy, ops::parameter(g, "am", am)},
                             {{"kernel", Ints{2, 2}}, {"in_shape", Ints{1, 1, 4, 4}}}, 0);
  g.add_output(dx);
  runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
  try {
    exe.run();
    FAIL() << "an argmax outside its window was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_pool2d_bwd"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("an argmax lies outside its 2x2 window"));
  }
}
