#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

using Ints = ir::Ints;

static const std::vector<OpCase> kSum = {
    OpCase().shapes({{3, 7}}),
    OpCase().shapes({{1}}),
    OpCase().shapes({{3, 7}}).attrs({{"axes", Ints{0}}}),
    OpCase().shapes({{3, 7}}).attrs({{"axes", Ints{-1}}, {"keepdim", true}}),
    OpCase().shapes({{2, 3, 4, 5}}).attrs({{"axes", Ints{0, 2}}}),
    OpCase().shapes({{2, 3, 4, 5}}).attrs({{"axes", Ints{1, 3}}, {"keepdim", true}}),
    OpCase().shapes({{2, 3, 70}}).attrs({{"axes", Ints{1}}}),  // more than one block of 64
    OpCase().shapes({{2, 1, 4}}).attrs({{"axes", Ints{1}}}),   // a dimension of size 1
    OpCase().shapes({{2, 3}}).attrs({{"axes", Ints{0, 1}}, {"keepdim", true}}),
};
static const std::vector<BadCase> kSumBad = {
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
    {{{3, 4}}, {}, {{"axes", Ints{2}}}, "axis 2 is out of range for rank 2"},
    {{{3, 4}}, {}, {{"axes", Ints{-3}}}, "axis -3 is out of range for rank 2"},
    {{{3, 4}}, {}, {{"axes", Ints{1, -1}}}, "axis -1 is given twice in axes [1,-1]"},
};
MINIDL_OP_TEST(sum, kSum, kSumBad)

static const std::vector<OpCase> kMean = {
    OpCase().shapes({{5, 2, 3}}),
    OpCase().shapes({{5, 2, 3}}).attrs({{"axes", Ints{-1}}}),
    OpCase().shapes({{5, 2, 3}}).attrs({{"axes", Ints{0, 2}}, {"keepdim", true}}),
};
MINIDL_OP_TEST(mean, kMean, kSumBad)

static const std::vector<OpCase> kMax = {
    OpCase().shapes({{3, 7}}).avoid_ties(),
    OpCase().shapes({{3, 7}}).avoid_ties().attrs({{"axes", Ints{1}}}),
    OpCase().shapes({{2, 3, 4, 5}}).avoid_ties().attrs({{"axes", Ints{0, 2}}, {"keepdim", true}}),
    OpCase().shapes({{2, 3, 70}}).avoid_ties().attrs({{"axes", Ints{-2}}}),
};
MINIDL_OP_TEST(max, kMax, kSumBad)

static const std::vector<OpCase> kMaxBwd = {
    OpCase().shapes({{3}, {3, 7}}).attrs({{"axes", Ints{1}}}).constants({1}).avoid_ties(),
};
static const std::vector<BadCase> kMaxBwdBad = {
    {{{7}, {3, 7}}, {}, {{"axes", Ints{1}}}, "dy has shape [7], expected the max's [3]"},
};
MINIDL_OP_TEST(max_bwd, kMaxBwd, kMaxBwdBad)

// The sum and mean over axes match a double-precision loop; keepdim only changes the shape.
TEST(Sum, OverAxesMatchesALoop) {
  ir::Graph g;
  Tensor x = Tensor::empty({2, 3, 4});
  for (int i = 0; i < 24; ++i) x.data<float>()[i] = static_cast<float>(i);
  ir::Value* px = ops::parameter(g, "x", x);
  ir::Value* s = ops::sum(px, {0, 2});
  ir::Value* m = ops::mean(px, {-1}, true);
  EXPECT_EQ(s->shape(), Shape({3}));
  EXPECT_EQ(m->shape(), Shape({2, 3, 1}));
  g.add_output(s);
  g.add_output(m);
  runtime::Executable exe(g);
  exe.run();
  for (int c = 0; c < 3; ++c) {
    double want = 0.0;
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 4; ++b) want += a * 12 + c * 4 + b;
    EXPECT_EQ(exe.value(s).at(c), static_cast<float>(want));
  }
  for (int r = 0; r < 6; ++r) EXPECT_EQ(exe.value(m).at(r), static_cast<float>(r * 4 + 1.5));
}

// max's gradient goes to the first maximal element only.
TEST(Max, GradientToTheFirstMaximum) {
  ir::Graph g;
  Tensor x = Tensor::empty({2, 3});
  const float v[] = {1, 5, 5, 7, 7, 7};
  std::copy(v, v + 6, x.data<float>());
  ir::Value* px = ops::parameter(g, "x", x);
  ir::Value* dx = autograd::differentiate(g, ops::sum(ops::max(px, {1})), {px})[0];
  g.add_output(dx);
  runtime::Executable exe(g);
  exe.run();
  const float want[] = {0, 1, 0, 1, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(exe.value(dx).at(i), want[i]) << i;
}

// expand broadcasts any shape; the old scalar form is one case of it.
static const std::vector<OpCase> kExpandMore = {
    OpCase().shapes({{3, 1}}).attrs({{"shape", ir::Ints{2, 3, 4}}, {"alpha", 2.0}}),
};
TEST(Expand, BroadcastsAnyShape) {
  minidl::testing::run_op_cases(
      "expand", kExpandMore,
      {{{{2, 3}}, {}, {{"shape", ir::Ints{3, 3}}}, "cannot expand [2,3] to [3,3]"}});
}

static const std::vector<OpCase> kExpand = {
    OpCase().shapes({{}}).attrs({{"shape", ir::Ints{3, 4}}, {"alpha", 0.5}}),
    OpCase().shapes({{1}}).attrs({{"shape", ir::Ints{2}}}),
};
static const std::vector<BadCase> kExpandBad = {
    {{{2}}, {}, {{"shape", ir::Ints{3}}}, "cannot expand [2] to [3]"},
};
MINIDL_OP_TEST(expand, kExpand, kExpandBad)

// The sum of a large tensor is the same with 1 and 2 threads (fixed chunks, fixed order), over
// every element and over chosen axes.
TEST(Sum, SameResultForAnyThreadCount) {
  Tensor x = Tensor::empty({1 << 20});
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = 1.0f / static_cast<float>(1 + i % 977);
  Tensor x3 = x.reshaped({64, 128, 128});
  auto run = [&](int threads) {
    set_num_threads(threads);
    ir::Graph g;
    ir::Value* s = ops::sum(ops::parameter(g, "x", x));
    ir::Value* px3 = ops::parameter(g, "x3", x3);
    ir::Value* s0 = ops::sum(px3, {0});
    ir::Value* s02 = ops::mean(px3, {0, 2});
    for (ir::Value* v : {s, s0, s02}) g.add_output(v);
    runtime::Executable exe(g);
    exe.run();
    std::vector<float> out;
    for (ir::Value* v : {s, s0, s02})
      for (std::int64_t i = 0; i < v->shape().numel(); ++i) out.push_back(exe.value(v).at(i));
    return out;
  };
  const int saved = max_threads();
  const std::vector<float> one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}
