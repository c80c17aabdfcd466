// Collective ops in a single process (group 0 is the local communicator here) and the
// data-parallel pass's rewrite. The multi-rank behaviour is in mpi_test_data_parallel.cpp.
#include <gmock/gmock.h>

#include "minidl/autograd/autograd.hpp"
#include "minidl/frontend/optim.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ir/verifier.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "ops/harness.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const bool kRegistered = (parallel::register_collective_ops(), true);
static const std::vector<OpCase> kAllreduce = {
    OpCase().shapes({{4, 5}}).attrs({{"scale", 0.5}}).loss_outputs({0}),
};
static const std::vector<BadCase> kAllreduceBad = {
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
};
MINIDL_OP_TEST(allreduce, kAllreduce, kAllreduceBad)

TEST(DataParallelPass, ReducesEveryGradientRightAfterItIsFinal) {
  Tensor w1 = Tensor::zeros({8, 4}), w2 = Tensor::zeros({3, 8});
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 4});
  ir::Value* y = ops::input(g, "labels", {2}, DType::I32);
  ir::Value* p1 = ops::parameter(g, "fc1.weight", w1);
  ir::Value* p2 = ops::parameter(g, "fc2.weight", w2);
  ir::Value* h = ops::relu(ops::matmul(x, p1, false, true));
  ir::Value* loss = ops::softmax_cross_entropy(ops::matmul(h, p2, false, true), y).first;
  optim::Sgd sgd({.lr = 0.1});
  sgd.apply(g, {p1, p2}, autograd::differentiate(g, loss, {p1, p2}));
  auto local = parallel::make_local_communicator();
  parallel::DataParallel pass(*local, 0.5);
  ASSERT_TRUE(pass.run(g));
  ir::verify(g);
  int reductions = 0;
  const auto& nodes = g.nodes();
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i]->op() != "allreduce") continue;
    ++reductions;
    EXPECT_EQ(nodes[i]->attrs().get<double>("scale"), 0.5);
    // Right after the node that produced the gradient, so it can overlap what follows.
    EXPECT_EQ(nodes[i - 1], nodes[i]->input(0)->producer());
    // The update reads the reduced gradient, nothing else reads the unreduced one.
    for (ir::Node* u : nodes[i]->output()->users()) EXPECT_EQ(u->op(), "sgd");
    EXPECT_EQ(nodes[i]->input(0)->users().size(), 1u);
  }
  EXPECT_EQ(reductions, 2);
  EXPECT_THAT(ir::to_text(g), ::testing::HasSubstr("= allreduce(%"));
}
