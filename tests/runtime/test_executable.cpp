#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/denormals.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace {
// A small MLP training graph: enough values for buffer reuse to matter.
struct Mlp {
  Tensor w1 = Tensor::empty({32, 20}), w2 = Tensor::empty({10, 32}), b1 = Tensor::zeros({32});
  ir::Graph g;
  ir::Value* loss;
  std::vector<ir::Value*> grads;
  Mlp() {
    CounterRng(3).fill_normal(w1, 1, 0.0f, 0.3f);
    CounterRng(3).fill_normal(w2, 2, 0.0f, 0.3f);
    ir::Value* x = ops::input(g, "x", {16, 20});
    ir::Value* y = ops::input(g, "labels", {16}, DType::I32);
    ir::Value* p1 = ops::parameter(g, "w1", w1);
    ir::Value* pb = ops::parameter(g, "b1", b1);
    ir::Value* p2 = ops::parameter(g, "w2", w2);
    ir::Value* h = ops::tanh(ops::bias_add(ops::matmul(x, p1, false, true), pb));
    h = ops::relu(ops::scale(h, 1.5));
    loss = ops::softmax_cross_entropy(ops::matmul(h, p2, false, true), y).first;
    grads = autograd::differentiate(g, loss, {p1, pb, p2});
    g.add_output(loss);
    for (auto* gv : grads) g.add_output(gv);
  }
};

void feed(runtime::Executable& e) {
  Tensor x = e.input("x");
  CounterRng(9).fill_uniform(x, 0, -1.0f, 1.0f);
  auto* y = e.input("labels").data<std::int32_t>();
  for (int i = 0; i < 16; ++i) y[i] = i % 10;
}
}  // namespace

TEST(Executable, BufferReuseDoesNotChangeResults) {
  Mlp m;
  runtime::Executable reuse(m.g, {.reuse_memory = true});
  runtime::Executable fresh(m.g, {.reuse_memory = false});
  feed(reuse);
  feed(fresh);
  reuse.run();
  fresh.run();
  EXPECT_LT(reuse.memory().planned_bytes, fresh.memory().planned_bytes);
  EXPECT_LT(reuse.memory().buffers, fresh.memory().buffers);
  EXPECT_EQ(reuse.value(m.loss).at(0), fresh.value(m.loss).at(0));
  for (auto* gv : m.grads) {
    const Tensor& a = reuse.value(gv);
    const Tensor& b = fresh.value(gv);
    for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.at(i), b.at(i)) << gv->ref();
  }
}

TEST(Executable, RunsAreRepeatable) {
  Mlp m;
  runtime::Executable e(m.g);
  feed(e);
  e.run();
  const float first = e.value(m.loss).at(0);
  e.run();
  EXPECT_EQ(first, e.value(m.loss).at(0));
}

TEST(Executable, UnknownInputAndUnreadableValue) {
  Mlp m;
  runtime::Executable e(m.g);
  EXPECT_THAT([&] { e.input("images"); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                              "no input 'images' (inputs: x, labels)")));
  const ir::Value* hidden = m.g.find("tanh")->output();
  EXPECT_THAT([&] { e.value(hidden); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("not readable after a run")));
}

TEST(Executable, BoundStorageMustMatch) {
  ir::Graph g;
  Tensor t = Tensor::zeros({3});
  ir::Value* p = ops::parameter(g, "p", t);
  g.add_output(ops::relu(p));
  // Rebind through a second graph whose parameter claims another shape.
  ir::Graph h;
  Tensor small = Tensor::zeros({2});
  h.add_source(ops::op("parameter"), {{"shape", ir::Ints{3}}}, "p", small);
  EXPECT_THAT([&] { runtime::Executable e(h); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("bound storage is [2]")));
}

// Profiling counts every kernel call with the op's FLOP count and keeps the first call's time
// apart (within the total); tracing records one event per call, ordered and non-overlapping on
// the thread, and stops at its limit.
TEST(Executable, ProfileAndTrace) {
  Mlp m;
  runtime::Executable e(m.g, {.profile = true, .trace = true});
  feed(e);
  e.run();
  std::vector<double> first;
  for (const runtime::KernelProfile& k : e.profile()) {
    EXPECT_EQ(k.first_seconds, k.seconds) << k.node->describe() << ": one call so far";
    first.push_back(k.first_seconds);
  }
  e.run();
  std::size_t kernels = 0;
  for (const runtime::KernelProfile& k : e.profile()) {
    EXPECT_EQ(k.calls, 2) << k.node->describe();
    EXPECT_GE(k.seconds, 0.0);
    EXPECT_EQ(k.first_seconds, first[kernels]) << k.node->describe() << ": the first call's";
    EXPECT_GE(k.seconds, k.first_seconds) << k.node->describe();
    if (k.node->name() == "matmul") {  // x[16,20] * w1^T[20,32]
      EXPECT_EQ(k.flops, 2 * 16 * 32 * 20);
    } else if (k.node->op() != "matmul") {
      EXPECT_EQ(k.flops, 0) << k.node->describe();
    }
    ++kernels;
  }
  ASSERT_GT(kernels, 10u);
  const std::vector<runtime::TraceEvent> events = e.trace();
  ASSERT_EQ(events.size(), 2 * kernels);
  EXPECT_EQ(e.dropped_events(), 0u);
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].thread, 0);
    EXPECT_GE(events[i].duration_us, 0.0);
    EXPECT_EQ(events[i].node, e.profile()[i % kernels].node);
    if (i > 0) {
      EXPECT_GE(events[i].begin_us, events[i - 1].begin_us + events[i - 1].duration_us);
    }
  }

  runtime::Executable limited(m.g, {.trace = true, .trace_limit = 5});
  feed(limited);
  limited.run();
  EXPECT_EQ(limited.trace().size(), 5u);
  EXPECT_EQ(limited.dropped_events(), kernels - 5);
}

// check_numerics: the first node whose output holds a NaN or Inf throws, naming itself and
// which inputs were already non-finite; without the option the same run goes through.
TEST(Executable, CheckNumericsNamesTheFirstNonFiniteNode) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 3});
  ir::Value* big = ops::scale(x, 1e30);        // 1e30 * 1e10 overflows to +Inf
  ir::Value* y = ops::relu(ops::add(big, x));  // Inf from here on; relu is not the first
  g.add_output(y);
  for (bool check : {false, true}) {
    runtime::Executable exe(g, {.check_numerics = check});
    float* in = exe.input("x").data<float>();
    for (int i = 0; i < 6; ++i) in[i] = i == 4 ? 1e10f : 1.0f;
    if (!check) {
      EXPECT_NO_THROW(exe.run());
      continue;
    }
    EXPECT_THAT(
        [&] { exe.run(); },
        ::testing::ThrowsMessage<Error>(::testing::AllOf(
            ::testing::HasSubstr("check-numerics: scale"),
            ::testing::HasSubstr("produced +Inf at element 4 of output 0 [2,3]"),
            ::testing::HasSubstr("its inputs: %" + std::to_string(x->id()) + " (x) finite"))));
    in[4] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THAT([&] { exe.run(); }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                        "produced NaN at element 4 of output 0 [2,3]; its "
                                        "inputs: %" +
                                        std::to_string(x->id()) + " (x) has NaN at element 4")));
  }
}

#if MINIDL_WITH_ONEDNN
// Values stored as bf16 (between bf16 kernels, --precision bf16) are scanned too.
TEST(Executable, CheckNumericsScansBf16Values) {
  if (!ops::bf16_unavailable().empty()) GTEST_SKIP() << "bf16 " << ops::bf16_unavailable();
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 16, 2, 2});
  ir::Value* y = ops::relu(x);  // oneDNN's bf16 eltwise, on bf16 in and out
  g.add_output(y);
  x->set_stored(DType::BF16);
  y->set_stored(DType::BF16);
  runtime::Executable exe(g, {.backend = ir::Backend::OneDnn, .check_numerics = true});
  auto* in = static_cast<std::uint16_t*>(exe.input("x").raw());
  for (int i = 0; i < 128; ++i) in[i] = 0x3f80;  // 1.0
  exe.run();
  in[5] = 0x7f80;  // +Inf
  EXPECT_THAT([&] { exe.run(); },
              ::testing::ThrowsMessage<Error>(
                  ::testing::AllOf(::testing::HasSubstr("check-numerics: relu"),
                                   ::testing::HasSubstr("produced +Inf at element 5 of output 0"),
                                   ::testing::HasSubstr("(x) has +Inf at element 5"))));
}
#endif

TEST(Executable, CountsSubnormalOutputs) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {4});
  ir::Value* y = ops::scale(x, 1e-10);
  g.add_output(y);
  for (Denormals mode : {Denormals::Keep, Denormals::Flush}) {
    set_denormals(mode);
    runtime::Executable e(g, {.count_denormals = true});
    float* in = e.input("x").data<float>();
    in[0] = 1e-30f;  // * 1e-10: 1e-40, subnormal
    in[1] = -1e-30f;
    in[2] = 1.0f;
    in[3] = 0.0f;
    e.run();
    e.run();
    std::int64_t total = 0, last = 0, runs_with = 0;
    for (const runtime::SubnormalCount& c : e.subnormals()) {
      if (c.value != y) continue;
      EXPECT_EQ(c.elements, 4);
      total = c.total;
      last = c.last;
      runs_with = c.runs_with;
    }
    EXPECT_EQ(e.counted_runs(), 2);
    if (mode == Denormals::Keep) {
      EXPECT_EQ(total, 4);
      EXPECT_EQ(last, 2);
      EXPECT_EQ(runs_with, 2);
      EXPECT_THAT(e.subnormal_report(), ::testing::HasSubstr(y->producer()->describe()));
    } else if (flushing_denormals()) {  // x86: flush-to-zero made them 0
      EXPECT_EQ(total, 0);
      EXPECT_THAT(e.subnormal_report(), ::testing::HasSubstr("0 in total"));
    }
  }
  set_denormals(Denormals::Keep);
}
