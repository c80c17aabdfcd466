#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<BadCase> kBad = {
    {{{2}}, {}, {{"max_norm", 1.0}}, "expected a single f32 element"},
    {{{}}, {}, {{"max_norm", 0.0}}, "max_norm must be positive"},
};
MINIDL_OP_TEST(clip_coef, std::vector<OpCase>{}, kBad)

namespace {
std::pair<float, float> coef(float sum_sq, double max_norm) {
  ir::Graph g;
  ir::Node* n = g.add_node(ops::op("clip_coef"), {ops::parameter(g, "s", Tensor::full({}, sum_sq))},
                           {{"max_norm", max_norm}});
  g.add_output(n->output(0));
  g.add_output(n->output(1));
  runtime::Executable exe(g);
  exe.run();
  return {exe.value(n->output(0)).at(0), exe.value(n->output(1)).at(0)};
}
}  // namespace

// torch.nn.utils.clip_grad_norm_: coef = min(1, max_norm / (norm + 1e-6)).
TEST(ClipCoef, ScalesDownOnlyAboveTheLimit) {
  auto [c, norm] = coef(25.0f, 1.0);
  EXPECT_FLOAT_EQ(norm, 5.0f);
  EXPECT_FLOAT_EQ(c, 1.0f / (5.0f + 1e-6f));
  EXPECT_FLOAT_EQ(coef(0.25f, 1.0).first, 1.0f);
  EXPECT_FLOAT_EQ(coef(0.0f, 1.0).first, 1.0f);
}
