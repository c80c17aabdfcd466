// A stage's step time by kind and its bubble (frontend/stage_times.hpp), from a synthetic
// profile: the idle part a receive noted is the bubble, not its copy, not a send's copy, and not
// a slow kernel; the bubble is idle over the whole step; the stages' report names each stage's
// bubble beside the ideal (P-1)/(M+P-1).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/frontend/stage_times.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/communicator.hpp"

using namespace minidl;
using ::testing::HasSubstr;

namespace {

runtime::KernelProfile row(const ir::Node* n, double seconds, double idle = 0.0) {
  return {.node = n, .kernel = "k", .calls = 1, .seconds = seconds, .idle_seconds = idle};
}

TEST(StageTimes, SplitsTheStepByKindAndCountsOnlyWaitsAsIdle) {
  ir::Graph g;
  // A stage that receives an activation, computes, sends it on, receives its gradient,
  // computes the backward and updates.
  ir::Value* a = parallel::recv(g, {4, 8}, DType::F32, 0, 5, 0, "recv_act");
  a->producer()->set_phase(ir::Phase::Communication);
  ir::Value* h = ops::relu(a);
  ir::Node* send = parallel::send(h, 1, 6, 0, "send_act");
  send->set_phase(ir::Phase::Communication);
  ir::Value* dh = parallel::recv(g, {4, 8}, DType::F32, 1, 7, 0, "recv_grad");
  dh->producer()->set_phase(ir::Phase::Communication);
  ir::Value* da = ops::relu(dh);
  da->producer()->set_phase(ir::Phase::Backward);
  ir::Value* u = ops::scale(da, 0.5);
  u->producer()->set_phase(ir::Phase::Update);
  // Seconds: forward 3, backward 5, update 1; the activation's receive waited 2 of its 2.5,
  // the gradient's 4 of its 4.25; the send (a copy) took 0.75 and waited for nothing.
  const std::vector<runtime::KernelProfile> profile{
      row(a->producer(), 2.5, 2.0),   row(h->producer(), 3.0),  row(send, 0.75),
      row(dh->producer(), 4.25, 4.0), row(da->producer(), 5.0), row(u->producer(), 1.0)};
  const StageTimes t = stage_times(profile);
  EXPECT_DOUBLE_EQ(t.forward, 3.0);
  EXPECT_DOUBLE_EQ(t.backward, 5.0);
  EXPECT_DOUBLE_EQ(t.update, 1.0);
  EXPECT_DOUBLE_EQ(t.communication, 0.5 + 0.75 + 0.25);
  EXPECT_DOUBLE_EQ(t.idle, 6.0);
  EXPECT_DOUBLE_EQ(t.step(), 16.5);
  EXPECT_DOUBLE_EQ(t.bubble(), 6.0 / 16.5);
  // An epoch's times are the difference of the running totals.
  const StageTimes later = stage_times(
      std::vector<runtime::KernelProfile>{row(h->producer(), 4.0), row(dh->producer(), 7.0, 6.5)});
  const StageTimes d = later - stage_times(std::vector<runtime::KernelProfile>{
                                   row(h->producer(), 3.0), row(dh->producer(), 4.25, 4.0)});
  EXPECT_DOUBLE_EQ(d.forward, 1.0);
  EXPECT_DOUBLE_EQ(d.idle, 2.5);
  EXPECT_DOUBLE_EQ(d.communication, 0.25);
  EXPECT_DOUBLE_EQ(StageTimes{}.bubble(), 0.0);
}

TEST(StageTimes, IdealBubbleAndReport) {
  EXPECT_DOUBLE_EQ(ideal_bubble(2, 8), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(ideal_bubble(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(ideal_bubble(1, 4), 0.0);
  // Stage 0 waits 1 of its 4 ms per step, stage 1 half of its 4 (2 steps).
  const std::vector<StageTimes> stages{{.forward = 2.0, .backward = 4.0, .idle = 2.0},
                                       {.forward = 2.0, .communication = 2.0, .idle = 4.0}};
  const std::string text = format_stage_times(stages, 2000, 8, "  ");
  EXPECT_THAT(text, HasSubstr("stage 0 25.0% stage 1 50.0%, ideal (P-1)/(M+P-1) = 11.1%"));
  EXPECT_THAT(text, HasSubstr("stage 0 per step: forward 1.00 ms  backward 2.00 ms  update 0.00 "
                              "ms  communication 0.00 ms  idle 1.00 ms  (step 4.00 ms)"));
  EXPECT_THAT(text, HasSubstr("stage 1 per step: forward 1.00 ms"));
  // One process is one stage: the gather is its own times.
  auto comm = parallel::make_local_communicator();
  const auto one = gather_stage_times(*comm, stages[1], 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_DOUBLE_EQ(one[0].idle, 4.0);
  EXPECT_THROW(gather_stage_times(*comm, stages[1], 2), Error);
}

}  // namespace
