#include "harness.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = minidl::testing::broadcast_cases();
static const std::vector<BadCase> kBad = minidl::testing::broadcast_bad_cases();
MINIDL_OP_TEST(maximum, kCases, kBad)

// A tie gives the whole gradient to a: d/da sum(maximum(a, b)) = 1 and d/db = 0 where a == b.
TEST(Maximum, TieGoesToA) {
  using namespace minidl;
  ir::Graph g;
  Tensor a = Tensor::empty({2, 3}), b = Tensor::empty({3});
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = static_cast<float>(i % 3);
  for (int i = 0; i < 3; ++i) b.data<float>()[i] = static_cast<float>(i);
  ir::Value* va = ops::parameter(g, "a", a);
  ir::Value* vb = ops::parameter(g, "b", b);
  const auto grads = autograd::differentiate(g, ops::sum(ops::maximum(va, vb)), {va, vb});
  for (ir::Value* v : grads) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(exe.value(grads[0]).at(i), 1.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(exe.value(grads[1]).at(i), 0.0f);
}
