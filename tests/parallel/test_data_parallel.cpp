// The data-parallel pass's rewrite in one process (the local communicator): where each
// collective goes for every strategy, bucket size and overlap setting, that the graph still
// computes exactly what it computed before, the schedule in the preflight fingerprint, and the
// partition hook. The multi-rank results are in mpi_test_strategies.cpp.
#include <gmock/gmock.h>

#include <optional>
#include <unordered_map>

#include "minidl/ir/printer.hpp"
#include "minidl/ir/verifier.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/parallel/preflight.hpp"
#include "minidl/runtime/executable.hpp"
#include "parallel/dp_support.hpp"

using namespace minidl;
using minidl::testing::MlpStep;
using parallel::DataParallelOptions;
using parallel::ReduceStrategy;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

// One communicator for every graph here, so that their group ids agree.
parallel::Communicator& local() {
  static const auto comm = parallel::make_local_communicator();
  return *comm;
}

struct Rewritten {
  MlpStep step{16};
  std::string schedule;
  std::unordered_map<const ir::Node*, int> pos;
  std::vector<ir::Node*> nodes;

  explicit Rewritten(DataParallelOptions o, double share = 1.0) {
    parallel::DataParallel pass(local(), share, o);
    EXPECT_TRUE(pass.run(step.g));
    ir::verify(step.g);
    schedule = pass.schedule();
    nodes = step.g.nodes();
    for (ir::Node* n : nodes) pos[n] = static_cast<int>(pos.size());
  }
  std::vector<ir::Node*> all(std::string_view op) const {
    std::vector<ir::Node*> out;
    for (ir::Node* n : nodes)
      if (n->op() == op) out.push_back(n);
    return out;
  }
  bool is(const ir::Node* n, ir::Phase phase) const { return n->phase() == phase; }
  int last_backward() const {
    int last = -1;
    for (ir::Node* n : nodes)
      if (is(n, ir::Phase::Backward)) last = pos.at(n);
    return last;
  }
  int first_update() const {
    for (ir::Node* n : nodes)
      if (is(n, ir::Phase::Update)) return pos.at(n);
    return -1;
  }
  /// The update node reading the reduced gradient of parameter `param`.
  ir::Node* update_of(const std::string& param) const { return step.g.find(param + ".sgd"); }
};

const std::vector<std::string> kParams = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};

}  // namespace

// Bucket 0: one in-place allreduce_start per gradient right after its producer, the wait right
// before the update that reads it.
TEST(DataParallelPass, OneStartPerGradientRightAfterItIsFinal) {
  Rewritten r({.bucket_bytes = 0, .overlap = true});
  const auto starts = r.all("allreduce_start");
  ASSERT_EQ(starts.size(), 4u);
  EXPECT_TRUE(r.all("bucket_pack").empty());
  for (ir::Node* s : starts) {
    EXPECT_EQ(r.nodes[r.pos.at(s) - 1], s->input(0)->producer()) << s->name();
    EXPECT_EQ(s->attrs().get<double>("scale"), 1.0);
  }
  // All but the last gradient's reduction have backward work left to overlap.
  EXPECT_LT(r.pos.at(starts[2]), r.last_backward());
  for (const std::string& p : kParams) {
    ir::Node* u = r.update_of(p);
    ir::Node* wait = u->input(1)->producer();
    ASSERT_EQ(wait->op(), "allreduce_wait") << p;
    // Between the wait and its update only communication nodes.
    for (int i = r.pos.at(wait) + 1; i < r.pos.at(u); ++i)
      EXPECT_TRUE(r.is(r.nodes[i], ir::Phase::Communication)) << r.nodes[i]->describe();
  }
  // Polling between the starts and the waits, none after the last wait.
  const auto polls = r.all("comm_progress");
  EXPECT_FALSE(polls.empty());
  const int last_wait = r.pos.at(r.all("allreduce_wait").back());
  for (ir::Node* p : polls) EXPECT_LT(r.pos.at(p), last_wait);
  EXPECT_THAT(r.schedule, HasSubstr("strategy allreduce, bucket_bytes 0, overlap on"));
}

// Buckets are filled in the order the gradients become final; each is started right after its
// last gradient is packed.
TEST(DataParallelPass, BucketsFollowTheBackwardOrder) {
  // fc2.bias 40 B, fc2.weight 1280 B, fc1.bias 128 B, fc1.weight 8192 B, in backward order.
  Rewritten r({.bucket_bytes = 1500, .overlap = true});
  const auto fills = r.all("fill");
  const auto packs = r.all("bucket_pack");
  const auto starts = r.all("allreduce_start");
  ASSERT_EQ(starts.size(), 2u);
  ASSERT_EQ(packs.size(), 3u);  // fc1.weight is alone in its bucket: reduced in place
  EXPECT_EQ(packs[0]->name(), "bucket0.pack.fc2.bias");
  EXPECT_EQ(packs[1]->name(), "bucket0.pack.fc2.weight");
  EXPECT_EQ(packs[2]->name(), "bucket0.pack.fc1.bias");
  EXPECT_EQ(packs[2]->input(0)->producer(), packs[1]);
  EXPECT_EQ(starts[0]->input(0)->producer(), packs[2]);
  EXPECT_EQ(r.nodes[r.pos.at(starts[0]) - 1], packs[2]);
  EXPECT_EQ(starts[1]->name(), "bucket1.allreduce_start");
  EXPECT_EQ(starts[1]->input(0)->producer()->name().find("bucket"), std::string::npos);
  // Each pack right after its gradient's producer (the first after the bucket's fill).
  for (ir::Node* p : packs) {
    const ir::Node* prev = r.nodes[r.pos.at(p) - 1];
    if (prev->name() == "bucket0") prev = r.nodes[r.pos.at(p) - 2];
    EXPECT_EQ(prev, p->input(1)->producer()) << p->name();
  }
  bool bucket_fill = false;
  for (ir::Node* f : fills) bucket_fill |= f->name() == "bucket0";
  EXPECT_TRUE(bucket_fill);
  EXPECT_THAT(r.schedule, HasSubstr("bucket 0: 1448 bytes, bucket_pack -> allreduce_start -> "
                                    "allreduce_wait: fc2.bias, fc2.weight, fc1.bias"));
  EXPECT_THAT(r.schedule, HasSubstr("bucket 1: 8192 bytes, allreduce_start -> allreduce_wait: "
                                    "fc1.weight"));
  // Each update reads its own slice of the reduced bucket.
  for (const char* p : {"fc2.bias", "fc2.weight", "fc1.bias"}) {
    ir::Node* unpack = r.update_of(p)->input(1)->producer();
    EXPECT_EQ(unpack->name(), std::string("bucket0.unpack.") + p);
    EXPECT_EQ(unpack->input(0)->producer()->op(), "allreduce_wait");
  }
}

TEST(DataParallelPass, WithoutOverlapBlockingCollectivesFollowTheBackward) {
  Rewritten r({.bucket_bytes = 1500, .overlap = false});
  EXPECT_TRUE(r.all("allreduce_start").empty());
  EXPECT_TRUE(r.all("comm_progress").empty());
  const auto ars = r.all("allreduce");
  ASSERT_EQ(ars.size(), 2u);
  for (ir::Node* a : ars) {
    EXPECT_GT(r.pos.at(a), r.last_backward());
    EXPECT_LT(r.pos.at(a), r.first_update());
  }
  EXPECT_THAT(r.schedule, HasSubstr("overlap off"));
}

TEST(DataParallelPass, RootReducesToRankZeroAndBroadcastsTheUpdatedParameters) {
  Rewritten r({.strategy = ReduceStrategy::Root, .bucket_bytes = 0});
  const auto reduces = r.all("reduce");
  ASSERT_EQ(reduces.size(), 4u);
  for (ir::Node* n : reduces) EXPECT_EQ(n->attrs().get<std::int64_t>("root"), 0);
  for (const std::string& p : kParams) {
    ir::Node* u = r.update_of(p);
    ir::Node* next = r.nodes[r.pos.at(u) + 1];
    EXPECT_EQ(next->op(), "broadcast") << p;
    EXPECT_EQ(next->input(0), u->output(0)) << p;  // the parameter, not the velocity
    EXPECT_EQ(u->input(1)->producer()->op(), "reduce") << p;
  }
  EXPECT_TRUE(r.all("allreduce_start").empty());
}

TEST(DataParallelPass, HierarchicalReducesInTheNodeThenAmongLeaders) {
  Rewritten r({.strategy = ReduceStrategy::Hierarchical, .bucket_bytes = 1 << 20, .overlap = true});
  EXPECT_THAT(r.schedule, HasSubstr("bucket 0: 9640 bytes, bucket_pack -> reduce -> "
                                    "allreduce_start -> allreduce_wait -> broadcast: fc2.bias, "
                                    "fc2.weight, fc1.bias, fc1.weight"));
  const auto start = r.all("allreduce_start");
  ASSERT_EQ(start.size(), 1u);
  ir::Node* reduce = start[0]->input(0)->producer();
  EXPECT_EQ(reduce->op(), "reduce");
  EXPECT_EQ(r.nodes[r.pos.at(reduce) + 1], start[0]);
  const auto bcast = r.all("broadcast");
  ASSERT_EQ(bcast.size(), 1u);
  EXPECT_EQ(bcast[0]->input(0)->producer()->op(), "allreduce_wait");
  for (ir::Node* p : r.all("comm_progress"))
    EXPECT_EQ(p->attrs().get<std::int64_t>("group"), start[0]->attrs().get<std::int64_t>("group"));
}

// With one rank and share 1 every configuration must train exactly as the graph without the pass:
// this catches a wrong offset, a swapped slice or an update that reads the unreduced gradient.
TEST(DataParallelPass, EveryScheduleComputesTheSameStep) {
  const Dataset d = minidl::testing::blobs(16, 21);
  auto train = [&](std::optional<DataParallelOptions> o) {
    auto m = std::make_unique<MlpStep>(16);
    if (o) {
      parallel::DataParallel pass(local(), 1.0, *o);
      pass.run(m->g);
      ir::verify(m->g);
    }
    runtime::Executable exe(m->g);
    minidl::testing::feed(d, 0, 16, exe.input("x"), exe.input("labels"));
    for (int s = 0; s < 3; ++s) exe.run();
    return m;
  };
  auto reference = train(std::nullopt);
  for (ReduceStrategy s :
       {ReduceStrategy::Allreduce, ReduceStrategy::Root, ReduceStrategy::Hierarchical}) {
    for (std::int64_t bytes : {0, 100, 1500, 1 << 20}) {
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(fmt::format("{} bucket {} overlap {}", parallel::reduce_strategy_name(s),
                                 bytes, overlap));
        auto m =
            train(DataParallelOptions{.strategy = s, .bucket_bytes = bytes, .overlap = overlap});
        EXPECT_TRUE(minidl::testing::bitwise_equal(*m->model, *reference->model));
      }
    }
  }
}

TEST(DataParallelPass, TheScheduleIsPartOfTheFingerprint) {
  Rewritten a({.bucket_bytes = 0, .overlap = true}), b({.bucket_bytes = 1500, .overlap = true}),
      c({.bucket_bytes = 0, .overlap = true});
  Rewritten root({.strategy = ReduceStrategy::Root, .bucket_bytes = 0});
  const std::string fa = parallel::fingerprint(a.step.g);
  EXPECT_EQ(fa, parallel::fingerprint(c.step.g));
  EXPECT_NE(fa, parallel::fingerprint(b.step.g));
  EXPECT_NE(fa, parallel::fingerprint(root.step.g));
  EXPECT_THAT(parallel::fingerprint(b.step.g),
              HasSubstr("bucket_pack bucket0.pack.fc2.weight [362] f32 offset=10 <bucket0.pack."
                        "fc2.bias <"));
  // The share of the batch is not: ranks may hold one sample more than others.
  Rewritten share({.bucket_bytes = 0, .overlap = true}, 0.25);
  EXPECT_EQ(fa, parallel::fingerprint(share.step.g));
}

TEST(DataParallelPass, PartitionTakesOnePipelineStagePerGraph) {
  MlpStep m(4);
  auto local = parallel::make_local_communicator();
  // Pipeline stages and tensor-parallel shards each work, not both at once.
  parallel::DataParallel both(*local, 1.0, {.partition = {.stages = 2, .shards = 2}});
  EXPECT_THAT([&] { both.run(m.g); },
              ThrowsMessage<Error>(HasSubstr("a partition into 2 stages x 2 shards is not "
                                             "implemented (pipeline stages or tensor-parallel "
                                             "shards, not both)")));
  ir::Node* fc2 = m.g.find("fc2.matmul");
  ASSERT_NE(fc2, nullptr);
  parallel::set_stage(*fc2, 1);
  parallel::set_shard(*fc2, 0);
  EXPECT_EQ(parallel::stage_of(*fc2), 1);
  EXPECT_EQ(parallel::shard_of(*m.g.find("fc1.matmul")), 0);
  EXPECT_THAT(ir::to_text(m.g), HasSubstr("@shard=0 @stage=1"));
  EXPECT_THAT(ir::to_dot(m.g), HasSubstr("\\nstage 1\\nshard 0"));
  parallel::DataParallel pass(*local, 1.0);
  EXPECT_THAT([&] { pass.run(m.g); },
              ThrowsMessage<Error>(HasSubstr("stage 1, shard 0 lies outside the partition")));
  // Two stages in one graph: a graph holds one pipeline stage.
  parallel::DataParallel two(*local, 1.0, {.partition = {.stages = 2}});
  EXPECT_THAT([&] { two.run(m.g); },
              ThrowsMessage<Error>(HasSubstr("lies outside the partition (2 stage(s), 1 "
                                             "shard(s), one stage per graph)")));
  // The graph of stage 1 alone: its gradients are reduced over the communicator (the stage's).
  for (ir::Node* n : m.g.nodes()) parallel::set_stage(*n, 1);
  EXPECT_NO_THROW(two.run(m.g));
}

TEST(DataParallelPass, StrategyNames) {
  EXPECT_EQ(parallel::parse_reduce_strategy("hierarchical"), ReduceStrategy::Hierarchical);
  EXPECT_EQ(parallel::parse_reduce_strategy("tree"), ReduceStrategy::Tree);
  EXPECT_THAT(
      [] { parallel::parse_reduce_strategy("ring"); },
      ThrowsMessage<Error>(HasSubstr(
          "unknown reduce strategy 'ring' (expected allreduce, root, hierarchical or tree)")));
}
