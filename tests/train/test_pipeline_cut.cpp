// Where the automatic pipeline cut falls (train/pipeline_graph.hpp, assign_stages): by the
// forward's FLOPs when the ops count them (a chain whose FLOPs and parameters lie in different
// places is cut differently than by parameters), by parameter elements when no op counts them,
// and the summary line says which measure was used.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/ops/ops.hpp"
#include "minidl/train/pipeline_graph.hpp"

using namespace minidl;
using ::testing::HasSubstr;

namespace {

// The name of the last node of stage 0.
std::string cut_after(const ir::Graph& g, const std::unordered_map<const ir::Node*, int>& stage) {
  std::string last;
  for (const ir::Node* n : g.nodes())
    if (!n->def().is_source() && stage.at(n) == 0) last = n->op();
  return last;
}

TEST(PipelineCut, BalancesTheForwardFlops) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {256, 8});
  ir::Value* w1 = ops::parameter(g, "w1", Tensor::zeros({8, 8}));
  ir::Value* w2 = ops::parameter(g, "w2", Tensor::zeros({8, 8}));
  ir::Value* w3 = ops::parameter(g, "w3", Tensor::zeros({2048, 4}));
  const std::size_t begin = g.nodes().size();
  // Two products of 32768 FLOPs and 64 parameters each, then one of 16384 FLOPs and 8192
  // parameters: by parameters the cut falls after the second product, by FLOPs after the first.
  ir::Value* h1 = ops::relu(ops::matmul(x, w1));
  ir::Value* h2 = ops::relu(ops::matmul(h1, w2));
  ir::Value* y = ops::matmul(ops::reshape(h2, {1, 2048}), w3);
  const train::ForwardRange f{.begin = begin, .end = g.nodes().size(), .output = y};
  std::string summary;
  const auto stage = train::assign_stages(g, {f}, 2, {}, &summary);
  EXPECT_EQ(stage.at(h1->producer()), 0);
  EXPECT_EQ(stage.at(h2->producer()), 1);
  EXPECT_EQ(stage.at(y->producer()), 1);
  EXPECT_EQ(cut_after(g, stage), "relu");
  EXPECT_THAT(summary, HasSubstr("forward FLOPs per stage: 32768 (40.0%) 49152 (60.0%)"));
  EXPECT_THAT(summary, HasSubstr("balanced by forward FLOPs"));
  // The parameters sit with their readers.
  EXPECT_EQ(stage.at(w1->producer()), 0);
  EXPECT_EQ(stage.at(w2->producer()), 1);
}

TEST(PipelineCut, FallsBackToParametersWithoutFlopCounts) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {4, 8});
  ir::Value* p1 = ops::parameter(g, "p1", Tensor::zeros({4, 8}));
  ir::Value* p2 = ops::parameter(g, "p2", Tensor::zeros({4, 8}));
  ir::Value* p3 = ops::parameter(g, "p3", Tensor::zeros({4, 8}));
  ir::Value* p4 = ops::parameter(g, "p4", Tensor::zeros({4, 8}));
  const std::size_t begin = g.nodes().size();
  // Parameters 32, 32, 64 (two adds in the last): the lightest heaviest stage is 64 | 64.
  ir::Value* a = ops::relu(ops::add(x, p1));
  ir::Value* b = ops::relu(ops::add(a, p2));
  ir::Value* y = ops::add(ops::add(b, p3), p4);
  const train::ForwardRange f{.begin = begin, .end = g.nodes().size(), .output = y};
  std::string summary;
  const auto stage = train::assign_stages(g, {f}, 2, {}, &summary);
  EXPECT_EQ(stage.at(a->producer()), 0);
  EXPECT_EQ(stage.at(b->producer()), 0);
  EXPECT_EQ(stage.at(y->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("parameters per stage: 64 (50.0%) 64 (50.0%)"));
  EXPECT_THAT(summary, HasSubstr("balanced by parameter count (no op counts FLOPs)"));
}

}  // namespace
