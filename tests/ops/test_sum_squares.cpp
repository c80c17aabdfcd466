#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{7}}),
    OpCase().shapes({{3, 5}}),
};
static const std::vector<BadCase> kBad = {
    {{{4}}, {DType::I32}, {}, "expected f32 input"},
};
MINIDL_OP_TEST(sum_squares, kCases, kBad)

TEST(SumSquares, IsTheSquaredNorm) {
  ir::Graph g;
  ir::Value* y =
      ops::apply("sum_squares",
                 {ops::parameter(g, "x", Tensor::from(Shape{3}, std::vector<float>{3, -4, 12}))});
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_FLOAT_EQ(exe.value(y).at(0), 169.0f);
}

// Past one chunk (4096 elements) the chunks' double sums are added in order.
TEST(SumSquares, SpansChunks) {
  Tensor x = Tensor::empty({10000});
  double want = 0.0;
  for (int i = 0; i < 10000; ++i) {
    x.data<float>()[i] = static_cast<float>(i % 7) - 3.0f;
    want += static_cast<double>(x.data<float>()[i]) * x.data<float>()[i];
  }
  ir::Graph g;
  ir::Value* y = ops::apply("sum_squares", {ops::parameter(g, "x", x)});
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_FLOAT_EQ(exe.value(y).at(0), static_cast<float>(want));
}
