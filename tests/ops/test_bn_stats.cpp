// bn_stats on [N,C,H,W] and [N,C]; blocked layouts are in test_layouts.cpp (BatchNorm*), and the
// thread-count independence below.
#include <gtest/gtest.h>

#include "harness.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{2, 3, 3, 4}}),
    OpCase().shapes({{7, 5}}),
    OpCase().shapes({{2, 16, 3, 3}}),
    OpCase().shapes({{1, 2, 1, 1}}),
};
static const std::vector<BadCase> kBad = {
    {{{2, 3, 4}}, {}, {}, "expected x [N,C] or [N,C,H,W], got rank 3"},
    {{{5}}, {}, {}, "got rank 1"},
    {{{2, 3}}, {DType::I32}, {}, "expected f32 x, got i32"},
};
MINIDL_OP_TEST(bn_stats, kCases, kBad)

static const std::vector<BadCase> kBwdBad = {
    {{{2, 3, 4, 4}, {3, 4}}, {}, {}, "dstats must be [3,3] to match x"},
    {{{2, 3, 4, 4}, {2, 3}}, {}, {}, "dstats must be [3,3]"},
    {{{2, 3, 4, 4}, {3, 3}}, {DType::F32, DType::I32}, {}, "expected f32 dstats"},
};
MINIDL_OP_TEST(bn_stats_bwd, std::vector<OpCase>{}, kBwdBad)

namespace {
std::vector<float> stats_with_threads(const Tensor& x, int threads) {
  const int saved = max_threads();
  set_num_threads(threads);
  ir::Graph g;
  ir::Value* s = ops::bn_stats(ops::parameter(g, "x", x));
  g.add_output(s);
  runtime::Executable exe(g);
  exe.run();
  set_num_threads(saved);
  const Tensor& t = exe.value(s);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}
}  // namespace

TEST(BnStats, CountsSumsAndSquaresIndependentOfThreads) {
  Tensor x = Tensor::empty({37, 3, 9, 11});
  CounterRng(5).fill_normal(x, 0, 1.5f, 2.0f);
  const std::vector<float> one = stats_with_threads(x, 1);
  EXPECT_EQ(one, stats_with_threads(x, 2));
  EXPECT_EQ(one, stats_with_threads(x, 3));
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sq = 0;
    for (int n = 0; n < 37; ++n)
      for (int s = 0; s < 99; ++s) {
        const double v = x.at((n * 3 + c) * 99 + s);
        sum += v;
        sq += v * v;
      }
    EXPECT_EQ(one[c], 37.0f * 99.0f);
    EXPECT_FLOAT_EQ(one[3 + c], static_cast<float>(sum));
    EXPECT_FLOAT_EQ(one[6 + c], static_cast<float>(sq));
  }
}
