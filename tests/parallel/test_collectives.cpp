// Collective ops in a single process (group 0 is the local communicator here): schemas, shape
// rules and bad inputs through the op harness, and each kernel's serial meaning. The multi-rank
// behaviour is in mpi_test_collectives.cpp.
#include <gmock/gmock.h>

#include <cstdlib>

#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/op_table.hpp"
#include "minidl/runtime/executable.hpp"
#include "ops/harness.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// The harness looks ops up by name: the collectives join the op table before any test runs (not
// from a static initialiser, which could run before the op objects are constructed).
class RegisterCollectives final : public ::testing::Environment {
 public:
  void SetUp() override { parallel::register_ops(); }
};
static ::testing::Environment* const kRegister =
    ::testing::AddGlobalTestEnvironment(new RegisterCollectives);

static const std::vector<OpCase> kAllreduce = {
    OpCase().shapes({{4, 5}}).attrs({{"scale", 0.5}}).loss_outputs({0}),
};
static const std::vector<BadCase> kAllreduceBad = {
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
};
MINIDL_OP_TEST(allreduce, kAllreduce, kAllreduceBad)

static const std::vector<OpCase> kReduce = {
    OpCase().shapes({{3, 7}}).attrs({{"scale", 0.25}, {"root", 0}}),
};
static const std::vector<BadCase> kReduceBad = {
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
    {{{3}}, {}, {{"root", -1}}, "root must be a rank (>= 0), got -1"},
};
MINIDL_OP_TEST(reduce, kReduce, kReduceBad)

static const std::vector<OpCase> kBroadcast = {OpCase().shapes({{6}}).attrs({{"root", 0}})};
static const std::vector<BadCase> kBroadcastBad = {
    {{{3}}, {}, {{"root", -2}}, "root must be a rank (>= 0), got -2"},
};
MINIDL_OP_TEST(broadcast, kBroadcast, kBroadcastBad)

static const std::vector<OpCase> kAllgather = {OpCase().shapes({{2, 3}}).attrs({{"ranks", 1}})};
static const std::vector<BadCase> kAllgatherBad = {
    {{{3}}, {}, {{"ranks", 0}}, "ranks must be at least 1, got 0"},
    {{{3}}, {}, {}, "missing required attribute 'ranks'"},
};
MINIDL_OP_TEST(allgather, kAllgather, kAllgatherBad)

static const std::vector<OpCase> kTree = {
    OpCase().shapes({{3, 4}}).attrs({{"leaves", 5}}).loss_outputs({0}),
    OpCase().shapes({{3, 4}}).attrs({{"leaves", 5}, {"by_node", 1}}).loss_outputs({0}),
};
static const std::vector<BadCase> kTreeBad = {
    {{{3}}, {DType::I32}, {{"leaves", 2}}, "expected f32 input"},
    {{{3}}, {}, {{"leaves", 0}}, "leaves must be at least 1, got 0"},
    {{{3}}, {}, {}, "missing required attribute 'leaves'"},
    {{{3}},
     {},
     {{"leaves", 2}, {"by_node", 1}, {"ranks_per_node", -1}},
     "ranks_per_node must be >= 0 (0: the real nodes), got -1"},
};
MINIDL_OP_TEST(tree_allreduce, kTree, kTreeBad)

static const std::vector<OpCase> kHierarchical = {
    OpCase().shapes({{4, 5}}).attrs({{"scale", 0.5}}).loss_outputs({0}),
};
static const std::vector<BadCase> kHierarchicalBad = {
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
    {{{3}},
     {},
     {{"ranks_per_node", -2}},
     "ranks_per_node must be >= 0 (0: the real nodes), got -2"},
};
MINIDL_OP_TEST(hierarchical_allreduce, kHierarchical, kHierarchicalBad)

// The harness would read the in-flight value, which only the wait may do: these two ops have
// their own tests below, the harness checks their refusals.
static const std::vector<BadCase> kStartBad = {
    {{{3}}, {DType::I32}, {}, "expected f32 input"},
};
MINIDL_OP_TEST(allreduce_start, std::vector<OpCase>{}, kStartBad)
static const std::vector<BadCase> kWaitBad = {
    {{{3}, {1}}, {DType::F32, DType::I64}, {}, "the in-flight value and the request of one"},
};
MINIDL_OP_TEST(allreduce_wait, std::vector<OpCase>{}, kWaitBad)

static const std::vector<BadCase> kSendBad = {
    {{{3}}, {}, {{"peer", -1}}, "peer must be a rank (>= 0), got -1"},
    {{{3}}, {}, {{"peer", 0}, {"tag", 40000}}, "tag must be in [0, 32767], got 40000"},
};
MINIDL_OP_TEST(send, std::vector<OpCase>{}, kSendBad)
static const std::vector<BadCase> kRecvBad = {
    {{}, {}, {{"peer", 0}, {"shape", ir::Ints{2, 0}}}, "dimensions must be positive, got [2,0]"},
    {{}, {}, {{"peer", 0}, {"shape", ir::Ints{2}}, {"dtype", "f16"}}, "unknown dtype 'f16'"},
    {{}, {}, {{"shape", ir::Ints{2}}}, "missing required attribute 'peer'"},
};
MINIDL_OP_TEST(recv, std::vector<OpCase>{}, kRecvBad)

static const std::vector<OpCase> kPack = {
    OpCase().shapes({{10}, {2, 3}}).attrs({{"offset", 4}}),
};
static const std::vector<BadCase> kPackBad = {
    {{{10}, {2, 3}}, {}, {{"offset", 5}}, "offset 5 + 6 elements exceeds the bucket's 10"},
    {{{2, 5}, {3}}, {}, {{"offset", 0}}, "expected a flat f32 bucket"},
};
MINIDL_OP_TEST(bucket_pack, kPack, kPackBad)
static const std::vector<OpCase> kUnpack = {
    OpCase().shapes({{10}}).attrs({{"offset", 3}, {"shape", ir::Ints{3, 2}}}),
};
static const std::vector<BadCase> kUnpackBad = {
    {{{10}}, {}, {{"offset", 8}, {"shape", ir::Ints{3}}}, "offset 8 + [3] exceeds the bucket's 10"},
};
MINIDL_OP_TEST(bucket_unpack, kUnpack, kUnpackBad)
MINIDL_OP_TEST(comm_progress, std::vector<OpCase>{}, std::vector<BadCase>{})

namespace {

Tensor iota(Shape s, float start) {
  Tensor t = Tensor::empty(std::move(s));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

void expect_values(const Tensor& t, const std::vector<float>& want) {
  ASSERT_EQ(t.numel(), static_cast<std::int64_t>(want.size()));
  for (std::int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.at(i), want[i]) << "element " << i;
}

}  // namespace

// One process: each collective is the identity on its (scaled) input.
TEST(Collectives, SingleProcessMeaning) {
  Tensor a = iota({4}, 1), b = iota({4}, 1), c = iota({4}, 1), d = iota({2, 2}, 1);
  ir::Graph g;
  ir::Value* ya = parallel::allreduce(ops::parameter(g, "a", a), 0.5);
  ir::Value* yb = parallel::reduce(ops::parameter(g, "b", b), 2.0, 0);
  ir::Value* yc = parallel::broadcast(ops::parameter(g, "c", c), 0);
  ir::Value* yd = parallel::allgather(ops::parameter(g, "d", d));
  EXPECT_EQ(yd->shape(), (Shape{2, 2}));
  for (ir::Value* v : {ya, yb, yc, yd}) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();
  expect_values(a, {0.5, 1, 1.5, 2});  // in place: the parameter's own storage
  expect_values(b, {2, 4, 6, 8});
  expect_values(c, {1, 2, 3, 4});
  expect_values(exe.value(yd), {1, 2, 3, 4});
}

// One process owns the whole tree: its part is the sum already.
TEST(Collectives, TreeAllreduceOfOneRankIsItsPart) {
  Tensor x = iota({4}, 1);
  ir::Graph g;
  g.add_output(parallel::tree_allreduce(ops::parameter(g, "x", x), 3));
  runtime::Executable exe(g);
  exe.run();
  expect_values(x, {1, 2, 3, 4});
}

TEST(Collectives, AllgatherShapeFollowsTheRanks) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 3});
  ir::Node* n = g.add_node(parallel::op_allgather, {x}, {{"ranks", 4}});
  EXPECT_EQ(n->output()->shape(), (Shape{8, 3}));
  // The kernel refuses a ranks attribute that is not the group's size.
  g.add_output(n->output());
  EXPECT_THAT([&] { runtime::Executable exe(g); },
              ThrowsMessage<Error>(HasSubstr("ranks=4 but communicator group 0 has 1 ranks")));
}

// The pair shares the request through a tensor; the buffer is reduced in place.
TEST(Collectives, StartAndWaitReduceInPlace) {
  Tensor x = iota({5}, 0);
  ir::Graph g;
  const parallel::InFlight f = parallel::allreduce_start(ops::parameter(g, "x", x), 0.25);
  EXPECT_EQ(f.request->dtype(), DType::I64);
  ir::Value* other = ops::scale(ops::fill(g, {5}, 1.0f), 3.0);  // runs while in flight
  ir::Value* y = parallel::allreduce_wait(f);
  ir::Value* z = ops::add(y, other);
  g.add_output(z);
  runtime::Executable exe(g);
  for (int run = 0; run < 2; ++run) exe.run();  // requests are retired each run
  expect_values(x, {0, 0.0625, 0.125, 0.1875, 0.25});
  expect_values(exe.value(z), {3, 3.0625, 3.125, 3.1875, 3.25});
}

TEST(Collectives, OnlyTheWaitMayReadTheInFlightValue) {
  Tensor x = iota({3}, 0);
  ir::Graph g;
  const parallel::InFlight f = parallel::allreduce_start(ops::parameter(g, "x", x), 1.0, 0, "ar");
  ir::Value* peek = ops::relu(f.data);
  g.add_output(parallel::allreduce_wait(f));
  g.add_output(peek);
  EXPECT_THAT([&] { runtime::Executable exe(g); },
              ThrowsMessage<Error>(HasSubstr("allreduce_start 'ar' (%")));
  EXPECT_THAT(
      [&] { runtime::Executable exe(g); },
      ThrowsMessage<Error>(HasSubstr("only its allreduce_wait may read the in-flight value")));

  ir::Graph lone;
  parallel::allreduce_start(ops::parameter(lone, "x", x), 1.0, 0, "lone");
  EXPECT_THAT([&] { runtime::Executable exe(lone); },
              ThrowsMessage<Error>(HasSubstr("no allreduce_wait completes this allreduce")));
}

TEST(Collectives, WaitNeedsThePairOfOneStart) {
  Tensor x = iota({3}, 0), y = iota({3}, 0);
  ir::Graph g;
  const parallel::InFlight a = parallel::allreduce_start(ops::parameter(g, "x", x), 1.0);
  const parallel::InFlight b = parallel::allreduce_start(ops::parameter(g, "y", y), 1.0);
  EXPECT_THAT(
      [&] {
        parallel::allreduce_wait({a.data, b.request}, "mixed");
      },
      ThrowsMessage<Error>(HasSubstr("allreduce_wait 'mixed'")));
}

// A single process sends to itself: the message waits in the communicator for the recv.
TEST(Collectives, SendThenRecvInOneProcess) {
  Tensor x = iota({2, 3}, 7);
  ir::Graph g;
  parallel::send(ops::parameter(g, "x", x), 0, 5);
  ir::Value* y = parallel::recv(g, {2, 3}, DType::F32, 0, 5);
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  expect_values(exe.value(y), {7, 8, 9, 10, 11, 12});

  ir::Graph none;
  none.add_output(parallel::recv(none, {4}, DType::F32, 0, 6, 0, "lonely"));
  runtime::Executable e2(none);
  EXPECT_THAT([&] { e2.run(); },
              ThrowsMessage<Error>(HasSubstr("recv from rank 0 with tag 6: no message was sent")));

  ir::Graph far;
  parallel::send(ops::input(far, "x", {2}), 3, 0, 0, "far");
  EXPECT_THAT([&] { runtime::Executable exe(far); },
              ThrowsMessage<Error>(HasSubstr("send 'far' (%")));
}

// Timed (profile and trace), a receive measures its wait for the message apart from the
// rest: the wait is an idle event at the start of the call, the rest follows it without a gap,
// and the profile's idle seconds are the idle events' (within the call's time).
TEST(Collectives, RecvWaitIsIdleInProfileAndTrace) {
  ir::Graph g;
  parallel::send(ops::parameter(g, "x", iota({2, 3}, 7)), 0, 5);
  ir::Value* y = parallel::recv(g, {2, 3}, DType::F32, 0, 5, 0, "r");
  g.add_output(y);
  runtime::Executable exe(g, {.profile = true, .trace = true});
  for (int i = 0; i < 3; ++i) exe.run();
  expect_values(exe.value(y), {7, 8, 9, 10, 11, 12});
  double idle_us = 0.0;
  int calls = 0;
  const std::vector<runtime::TraceEvent> events = exe.trace();
  for (std::size_t i = 0; i < events.size(); ++i) {
    const runtime::TraceEvent& e = events[i];
    if (e.node != y->producer()) {
      EXPECT_FALSE(e.idle) << e.node->describe();  // a send waits for nothing
      continue;
    }
    if (!e.idle) {
      ++calls;
      continue;
    }
    idle_us += e.duration_us;
    ASSERT_LT(i + 1, events.size());
    EXPECT_EQ(events[i + 1].node, e.node);
    EXPECT_FALSE(events[i + 1].idle);
    EXPECT_DOUBLE_EQ(events[i + 1].begin_us, e.begin_us + e.duration_us);
  }
  EXPECT_EQ(calls, 3);
  for (const runtime::KernelProfile& k : exe.profile()) {
    if (k.node != y->producer()) {
      EXPECT_EQ(k.idle_seconds, 0.0) << k.node->describe();
      continue;
    }
    EXPECT_EQ(k.calls, 3);
    EXPECT_NEAR(k.idle_seconds, idle_us * 1e-6, 1e-12);
    EXPECT_LE(k.idle_seconds, k.seconds);
  }
}

TEST(Collectives, PackAndUnpackAreExactCopies) {
  Tensor a = iota({2, 2}, 1), b = iota({3}, 10);
  ir::Graph g;
  ir::Value* bucket = ops::fill(g, {7}, -1.0f);
  bucket = parallel::bucket_pack(bucket, ops::parameter(g, "a", a), 0);
  bucket = parallel::bucket_pack(bucket, ops::parameter(g, "b", b), 4);
  ir::Value* ua = parallel::bucket_unpack(bucket, 0, {2, 2});
  ir::Value* ub = parallel::bucket_unpack(bucket, 4, {3});
  g.add_output(bucket);
  g.add_output(ua);
  g.add_output(ub);
  runtime::Executable exe(g);
  exe.run();
  expect_values(exe.value(bucket), {1, 2, 3, 4, 10, 11, 12});
  expect_values(exe.value(ua), {1, 2, 3, 4});
  expect_values(exe.value(ub), {10, 11, 12});
}

TEST(Collectives, ProgressAndRequestsOnTheLocalCommunicator) {
  auto local = parallel::make_local_communicator();
  float data[2] = {1, 2};
  auto r1 = local->start_allreduce_sum(data, 2);
  auto r2 = local->start_allreduce_sum(data, 2);
  EXPECT_EQ(local->progress(), 2);
  local->wait(r1);
  EXPECT_EQ(local->progress(), 1);
  EXPECT_THAT([&] { local->wait(r1); }, ThrowsMessage<Error>(HasSubstr("which is not in flight")));
  local->wait(r2);
  EXPECT_EQ(local->progress(), 0);

  ir::Graph g;
  g.add_output(ops::fill(g, {1}, 0.0f));
  ir::Node* p = parallel::comm_progress(g);
  EXPECT_TRUE(p->outputs().empty());
  runtime::Executable exe(g);
  exe.run();
}

TEST(Collectives, SplitSharedOfOneProcess) {
  auto local = parallel::make_local_communicator();
  const auto& s = local->split_shared();
  EXPECT_EQ(s.node->size(), 1);
  EXPECT_EQ(s.leaders->size(), 1);
  EXPECT_TRUE(s.leader);
  EXPECT_EQ(s.nodes, 1);
  EXPECT_THAT([&] { local->split_shared(-1); },
              ThrowsMessage<Error>(HasSubstr("ranks per node must be positive")));
  ::setenv("MINIDL_RANKS_PER_NODE", "two", 1);
  EXPECT_THAT([&] { local->split_shared(); },
              ThrowsMessage<Error>(HasSubstr(
                  "MINIDL_RANKS_PER_NODE must be a positive integer (ranks per pretended node), "
                  "got 'two'")));
  ::unsetenv("MINIDL_RANKS_PER_NODE");
}
