// The fusion pass: which chains it folds, what it leaves alone, and that a fused training graph
// computes the same loss and gradients as the unfused one on every backend.
#include <gtest/gtest.h>

#include <algorithm>

#include "../support/synthetic.hpp"
#include "../support/training_graph.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::TrainingGraph;

namespace {

std::size_t count_op(const ir::Graph& g, std::string_view op) {
  return static_cast<std::size_t>(std::count_if(g.nodes().begin(), g.nodes().end(),
                                                [&](const ir::Node* n) { return n->op() == op; }));
}

}  // namespace

TEST(Fusion, FoldsBiasAndReluIntoMatmulAndKeepsResults) {
  const Dataset batch = minidl::testing::blobs(16, 3);
  auto model = minidl::testing::small_mlp();
  model->reset_parameters(7, "");
  TrainingGraph plain(*model, batch);
  TrainingGraph fused(*model, batch);
  ASSERT_TRUE(ops::FuseBiasActivation().run(fused.g));

  // fc1: matmul + bias_add + relu -> one node; fc2: matmul + bias_add -> one node. The backward
  // matmuls stay as they are (their outputs are not followed by bias_add or relu).
  EXPECT_EQ(count_op(plain.g, "bias_add"), 2u);
  EXPECT_EQ(count_op(fused.g, "bias_add"), 0u);
  EXPECT_EQ(count_op(fused.g, "relu"), 0u);
  EXPECT_EQ(count_op(fused.g, "relu_bwd"), 1u);  // reads the fused node's output
  EXPECT_EQ(count_op(fused.g, "matmul"), count_op(plain.g, "matmul"));
  const ir::Node* fc1 = fused.g.find("fc1.matmul+bias+relu");
  ASSERT_NE(fc1, nullptr) << ir::to_text(fused.g);
  EXPECT_EQ(fc1->attrs().get<std::string>("activation"), "relu");
  EXPECT_EQ(fc1->inputs().size(), 3u);
  ASSERT_NE(fused.g.find("fc2.matmul+bias"), nullptr) << ir::to_text(fused.g);
  EXPECT_NE(ir::to_text(fused.g).find("fused="), std::string::npos) << ir::to_text(fused.g);

  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  for (ir::Backend b : backends) {
    const auto want = plain.run(b);
    const auto got = fused.run(b);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      for (std::int64_t j = 0; j < want[i].numel(); ++j)
        ASSERT_NEAR(got[i].at(j), want[i].at(j), 1e-5f + 1e-4f * std::abs(want[i].at(j)))
            << "backend " << ir::backend_name(b) << ", output " << i << ", element " << j;
    }
  }
}

TEST(Fusion, LeavesSharedIntermediatesAlone) {
  Tensor at = Tensor::full({4, 3}, 0.5f), wt = Tensor::full({5, 3}, 0.25f);
  Tensor bt = Tensor::full({5}, -0.5f);
  ir::Graph g;
  ir::Value* a = ops::parameter(g, "a", at);
  ir::Value* w = ops::parameter(g, "w", wt);
  ir::Value* b = ops::parameter(g, "b", bt);
  ir::Value* y = ops::matmul(a, w, false, true);
  ir::Value* z = ops::bias_add(y, b);
  g.add_output(ops::relu(z));
  g.add_output(z);  // the pre-activation is read outside: only the bias may fold
  ASSERT_TRUE(ops::FuseBiasActivation().run(g));
  EXPECT_EQ(count_op(g, "relu"), 1u);
  EXPECT_EQ(count_op(g, "bias_add"), 0u);

  ir::Graph h;
  ir::Value* y2 = ops::matmul(ops::parameter(h, "a", at), ops::parameter(h, "w", wt), false, true);
  h.add_output(ops::bias_add(y2, ops::parameter(h, "b", bt)));
  h.add_output(y2);  // the product itself is read: nothing folds
  EXPECT_FALSE(ops::FuseBiasActivation().run(h));
  EXPECT_EQ(count_op(h, "bias_add"), 1u);
}
