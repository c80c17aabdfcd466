#include "harness.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kSum = {OpCase().shapes({{3, 7}}), OpCase().shapes({{1}})};
static const std::vector<BadCase> kSumBad = {{{{3}}, {DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(sum, kSum, kSumBad)

static const std::vector<OpCase> kMean = {OpCase().shapes({{5, 2, 3}})};
MINIDL_OP_TEST(mean, kMean, kSumBad)

static const std::vector<OpCase> kExpand = {
    OpCase().shapes({{}}).attrs({{"shape", ir::Ints{3, 4}}, {"alpha", 0.5}}),
    OpCase().shapes({{1}}).attrs({{"shape", ir::Ints{2}}}),
};
static const std::vector<BadCase> kExpandBad = {
    {{{2}}, {}, {{"shape", ir::Ints{3}}}, "expected a single-element input"},
};
MINIDL_OP_TEST(expand, kExpand, kExpandBad)

// The sum of a large tensor is the same with 1 and 2 threads (fixed chunks, fixed order).
TEST(Sum, SameResultForAnyThreadCount) {
  Tensor x = Tensor::empty({1 << 20});
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = 1.0f / static_cast<float>(1 + i % 977);
  auto run = [&](int threads) {
    set_num_threads(threads);
    ir::Graph g;
    ir::Value* s = ops::sum(ops::parameter(g, "x", x));
    g.add_output(s);
    runtime::Executable exe(g);
    exe.run();
    return exe.value(s).at(0);
  };
  const int saved = max_threads();
  const float one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}
