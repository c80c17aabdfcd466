#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{2, 3}, {4, 3}}),
    OpCase().shapes({{2, 3, 4}, {2, 1, 4}, {2, 5, 4}}).attrs({{"axis", std::int64_t{1}}}),
    OpCase().shapes({{2, 3}, {2, 2}}).attrs({{"axis", std::int64_t{-1}}}),
    OpCase().shapes({{5}}),
};
static const std::vector<BadCase> kBad = {
    {{{2, 3}, {2, 4}},
     {},
     {},
     "input 1 has shape [2,4], expected the shape of input 0, [2,3], but along axis 0"},
    {{{2, 3}, {2, 3, 1}}, {}, {{"axis", std::int64_t{1}}}, "input 1 has shape [2,3,1]"},
    {{{2, 3}}, {}, {{"axis", std::int64_t{2}}}, "axis 2 is out of range for rank 2"},
    {{{}}, {}, {}, "axis 0 is out of range for rank 0"},
};
MINIDL_OP_TEST(concat, kCases, kBad)

// More inputs than one node takes: the builder nests nodes, and the values are in order.
TEST(Concat, ManyInputsNest) {
  ir::Graph g;
  std::vector<Tensor> ts;
  std::vector<ir::Value*> xs;
  for (int i = 0; i < 40; ++i) {
    ts.push_back(Tensor::empty({1, 2}));
    ts.back().data<float>()[0] = static_cast<float>(2 * i);
    ts.back().data<float>()[1] = static_cast<float>(2 * i + 1);
    xs.push_back(ops::parameter(g, "x" + std::to_string(i), ts.back()));
  }
  ir::Value* y = ops::concat(xs, 0);
  EXPECT_EQ(y->shape(), Shape({40, 2}));
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  for (int i = 0; i < 80; ++i) EXPECT_EQ(exe.value(y).at(i), static_cast<float>(i));
}
