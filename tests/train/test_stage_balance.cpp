// The pipeline cut by profiled time (--stage-balance time, train/stage_balance.hpp): a table of
// node times decides the cut where FLOPs would decide otherwise; "flops" and "params" choose
// those measures; an empty table falls back to FLOPs and says so; an unknown measure is refused.
// The profile of a step is attributed to the forward nodes by name (a backward "<name>.bwd..."
// and a fused "<name>+bias+relu" to the forward node <name>), updates and communication left
// out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/ops/op_table.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/train/pipeline_graph.hpp"
#include "minidl/train/stage_balance.hpp"

using namespace minidl;
using ::testing::HasSubstr;

namespace {

struct Chain {
  ir::Graph g;
  ir::Value *h1, *h2, *y;
  train::ForwardRange f;
  // Two products of 32768 FLOPs, then one of 16384 (FLOPs cut after the first product).
  Chain() {
    ir::Value* x = ops::input(g, "x", {256, 8});
    ir::Value* w1 = ops::parameter(g, "w1", Tensor::zeros({8, 8}));
    ir::Value* w2 = ops::parameter(g, "w2", Tensor::zeros({8, 8}));
    ir::Value* w3 = ops::parameter(g, "w3", Tensor::zeros({2048, 4}));
    const std::size_t begin = g.nodes().size();
    h1 = ops::relu(ops::matmul(x, w1));
    h2 = ops::relu(ops::matmul(h1, w2));
    y = ops::matmul(ops::reshape(h2, {1, 2048}), w3);
    f = {.begin = begin, .end = g.nodes().size(), .output = y};
  }
  // The products' names, each with its time in seconds.
  std::map<std::string, double> times(double a, double b, double c) const {
    return {{h1->producer()->input(0)->producer()->name(), a},
            {h2->producer()->input(0)->producer()->name(), b},
            {y->producer()->name(), c}};
  }
};

TEST(StageBalance, CutsByProfiledTime) {
  Chain c;
  // The last product is slow (4 ms against 1 and 1): by time the first two share a stage.
  const auto table = c.times(1e-3, 1e-3, 4e-3);
  std::string summary;
  auto stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &table, "time");
  EXPECT_EQ(stage.at(c.h1->producer()), 0);
  EXPECT_EQ(stage.at(c.h2->producer()), 0);
  EXPECT_EQ(stage.at(c.y->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("profiled time per stage (forward and backward): 2.000 ms "
                                 "(33.3%) 4.000 ms (66.7%)"));
  EXPECT_THAT(summary, HasSubstr("balanced by profiled time"));
  // A slow first product moves the cut right after it.
  const auto first_slow = c.times(6e-3, 1e-3, 1e-3);
  stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &first_slow, "time");
  EXPECT_EQ(stage.at(c.h1->producer()), 0);
  EXPECT_EQ(stage.at(c.h2->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("6.000 ms (75.0%) 2.000 ms (25.0%)"));
  // A parameter's update (under its name) weighs on its reader's stage: 3, 1, 1 ms cut after
  // the first product, but a 4 ms update of w3 (read by the last) moves the cut after the
  // second.
  auto with_update = c.times(3e-3, 1e-3, 1e-3);
  stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &with_update, "time");
  EXPECT_EQ(stage.at(c.h2->producer()), 1);
  with_update["w3"] = 4e-3;
  stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &with_update, "time");
  EXPECT_EQ(stage.at(c.h2->producer()), 0);
  EXPECT_EQ(stage.at(c.y->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("4.000 ms (44.4%) 5.000 ms (55.6%)"));
}

TEST(StageBalance, OtherMeasuresAndFallbacks) {
  Chain c;
  const auto table = c.times(1e-3, 1e-3, 4e-3);
  std::string summary;
  // By FLOPs the cut is after the first product, whatever the table says.
  auto stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &table, "flops");
  EXPECT_EQ(stage.at(c.h2->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("balanced by forward FLOPs"));
  // No time measured: FLOPs, and the summary says why.
  const std::map<std::string, double> none;
  stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &none, "time");
  EXPECT_EQ(stage.at(c.h2->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("balanced by forward FLOPs (no profiled time)"));
  // By parameters (64, 64, 8192): the small ones together.
  stage = train::assign_stages(c.g, {c.f}, 2, {}, &summary, &table, "params");
  EXPECT_EQ(stage.at(c.h2->producer()), 0);
  EXPECT_EQ(stage.at(c.y->producer()), 1);
  EXPECT_THAT(summary, HasSubstr("balanced by parameter count"));
  EXPECT_THROW(train::assign_stages(c.g, {c.f}, 2, {}, &summary, &table, "memory"), Error);
}

TEST(StageBalance, AttributesBackwardAndFusedTimeToTheForwardNode) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {4});
  ir::Node* fc = g.add_node(ops::op_relu, {x}, {}, "fc1.matmul+bias+relu");
  ir::Node* pool = g.add_node(ops::op_relu, {fc->output()}, {}, "pool1.max_pool2d");
  ir::Node* bwd = g.add_node(ops::op_relu, {pool->output()}, {}, "fc1.matmul.bwd");
  bwd->set_phase(ir::Phase::Backward);
  ir::Node* bwd1 = g.add_node(ops::op_relu, {bwd->output()}, {}, "fc1.matmul.bwd.1");
  bwd1->set_phase(ir::Phase::Backward);
  ir::Node* pbwd = g.add_node(ops::op_relu, {bwd1->output()}, {}, "pool1.max_pool2d.bwd");
  pbwd->set_phase(ir::Phase::Backward);
  ir::Node* upd = g.add_node(ops::op_relu, {pbwd->output()}, {}, "fc1.weight.sgd");
  upd->set_phase(ir::Phase::Update);
  ir::Node* sent = g.add_node(ops::op_relu, {upd->output()}, {}, "pipeline.send_act0.0");
  sent->set_phase(ir::Phase::Communication);
  ir::Node* bwdx = g.add_node(ops::op_relu, {sent->output()}, {}, "fc2.bwdx.bwd");
  bwdx->set_phase(ir::Phase::Backward);
  auto row = [](const ir::Node* n, double s) {
    return runtime::KernelProfile{.node = n, .kernel = "k", .calls = 2, .seconds = s};
  };
  // Two steps' worth: the table holds seconds per step.
  const train::NodeSeconds t =
      train::attribute_to_forward({row(fc, 2.0), row(pool, 1.0), row(bwd, 4.0), row(bwd1, 2.0),
                                   row(pbwd, 6.0), row(upd, 8.0), row(sent, 3.0), row(bwdx, 1.0)},
                                  2);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_DOUBLE_EQ(t.at("fc1.matmul"), 4.0);        // (2 + 4 + 2) / 2
  EXPECT_DOUBLE_EQ(t.at("pool1.max_pool2d"), 3.5);  // (1 + 6) / 2
  EXPECT_DOUBLE_EQ(t.at("fc2.bwdx"), 0.5);          // ".bwdx" is not a backward suffix
}

}  // namespace
