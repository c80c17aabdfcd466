// The reduction strategies under mpirun (2 and 3 ranks; the Hierarchical tests also with
// MINIDL_RANKS_PER_NODE=1 and =2 on 3 ranks): after K training steps every strategy, bucket size
// and overlap setting agrees with the serial run, all ranks hold bitwise-identical parameters
// after every step, and a schedule that differs between ranks fails preflight.
#include <gmock/gmock.h>

#include <cstdlib>
#include <functional>
#include <map>

#include "minidl/frontend/trainer.hpp"
#include "parallel/dp_support.hpp"

using namespace minidl;
using parallel::ReduceStrategy;
using ::testing::HasSubstr;

namespace {

struct Config {
  ReduceStrategy strategy = ReduceStrategy::Allreduce;
  std::int64_t bucket_bytes = 0;
  bool overlap = true;
  std::string str() const {
    return fmt::format("{} bucket {} overlap {}", parallel::reduce_strategy_name(strategy),
                       bucket_bytes, overlap ? "on" : "off");
  }
};

// 256 samples at a global batch of 32: K = 8 steps per epoch. With `check`, called after every
// epoch (so with one batch per epoch, after every step).
std::unique_ptr<nn::Sequential> train_model(parallel::Communicator& comm, const Dataset& d,
                                            Config c, int epochs = 1,
                                            const std::function<void(nn::Module&)>& check = {}) {
  auto model = minidl::testing::small_mlp();
  model->reset(7);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
  Trainer t(*model, sgd,
            {.batch_size = 32,
             .seed = 3,
             .comm = &comm,
             .reduce_strategy = c.strategy,
             .bucket_bytes = c.bucket_bytes,
             .overlap = c.overlap});
  for (int e = 1; e <= epochs; ++e) {
    t.train_epoch(d, e);
    if (check) check(*model);
  }
  return model;
}

// Within one strategy only the grouping into collectives changes. With 2 ranks every sum is
// a + b, the same bits in any order; with 3 the MPI library may pick another algorithm (so
// another summation order) for another message size.
constexpr double kTolerance = 1e-5;

const std::vector<Config>& variants(ReduceStrategy s) {
  static std::map<ReduceStrategy, std::vector<Config>> all;
  auto& v = all[s];
  if (v.empty()) {
    for (std::int64_t bytes : {0, 1500, 1 << 20})
      for (bool overlap : {true, false}) v.push_back({s, bytes, overlap});
  }
  return v;
}

void strategy_matches_serial(ReduceStrategy s) {
  parallel::Communicator& world = parallel::world();
  ASSERT_GT(world.size(), 1) << "run this test under mpirun with at least 2 ranks";
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(256, 31);
  auto serial = train_model(*local, d, {});
  auto reference = train_model(world, d, {ReduceStrategy::Allreduce, 0, true});
  std::unique_ptr<nn::Sequential> first;
  int bitwise = 0;
  for (const Config& c : variants(s)) {
    SCOPED_TRACE(c.str());
    auto m = train_model(world, d, c);
    EXPECT_LT(minidl::testing::max_rel_diff(*m, *serial), kTolerance) << "against serial";
    EXPECT_LT(minidl::testing::max_rel_diff(*m, *reference), kTolerance) << "against allreduce";
    EXPECT_EQ(minidl::testing::ranks_that_differ(world, *m), 0);
    if (!first) {
      first = std::move(m);
      continue;
    }
    const bool same = minidl::testing::bitwise_equal(*m, *first);
    bitwise += same;
    if (world.size() == 2) {
      EXPECT_TRUE(same) << "another bucketing changed the bits";
    }
    EXPECT_LT(minidl::testing::max_rel_diff(*m, *first), kTolerance);
  }
  if (world.rank() == 0) {
    std::printf("[ info ] %s on %d ranks: %d of %zu variants bitwise equal to the first\n",
                std::string(parallel::reduce_strategy_name(s)).c_str(), world.size(), bitwise,
                variants(s).size() - 1);
  }
}

void identical_after_every_step(ReduceStrategy s) {
  parallel::Communicator& world = parallel::world();
  const Dataset d = minidl::testing::blobs(32, 32);  // one batch: an epoch is one step
  for (const Config& c : {Config{s, 0, true}, Config{s, 1500, false}}) {
    SCOPED_TRACE(c.str());
    int step = 0;
    train_model(world, d, c, 5, [&](nn::Module& m) {
      ++step;
      EXPECT_EQ(minidl::testing::ranks_that_differ(world, m), 0) << "after step " << step;
    });
    EXPECT_EQ(step, 5);
  }
}

}  // namespace

TEST(Strategies, AllreduceMatchesSerial) { strategy_matches_serial(ReduceStrategy::Allreduce); }
TEST(Strategies, RootMatchesSerial) { strategy_matches_serial(ReduceStrategy::Root); }
TEST(Strategies, IdenticalParametersAfterEveryStep) {
  identical_after_every_step(ReduceStrategy::Allreduce);
  identical_after_every_step(ReduceStrategy::Root);
}

// Also run by ctest with MINIDL_RANKS_PER_NODE=1 (every rank a node: all ranks are leaders) and
// =2 (on 3 ranks: a node of two and a node of one).
TEST(Hierarchical, MatchesSerial) {
  const auto& split = parallel::world().split_shared();
  if (const char* env = std::getenv("MINIDL_RANKS_PER_NODE")) {
    const int k = std::atoi(env);
    EXPECT_EQ(split.nodes, (parallel::world().size() + k - 1) / k) << "the split ignored " << env;
  }
  strategy_matches_serial(ReduceStrategy::Hierarchical);
}
TEST(Hierarchical, IdenticalParametersAfterEveryStep) {
  identical_after_every_step(ReduceStrategy::Hierarchical);
}

// Rank 1 packs its gradients into other buckets: every rank fails before the first step, and
// rank 1 is told where its schedule departs from rank 0's.
TEST(Strategies, PreflightCatchesAScheduleMismatch) {
  parallel::Communicator& world = parallel::world();
  const Dataset d = minidl::testing::blobs(64, 33);
  const std::int64_t bytes = world.rank() == 1 ? 1500 : 0;
  try {
    train_model(world, d, {ReduceStrategy::Allreduce, bytes, true});
    ADD_FAILURE() << "rank " << world.rank() << " trained with a mismatched schedule";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("preflight: the training set-up of rank(s) 1 differs from rank "
                                "0's"));
    if (world.rank() == 1) {
      EXPECT_THAT(what, HasSubstr("rank 0 has 'allreduce_start bucket0.allreduce_start [10] f32"));
      EXPECT_THAT(what, HasSubstr("rank 1 has 'fill bucket0 [362] f32"));
    }
  }
  // Another strategy on the last rank: caught the same way, no rank hangs in a collective.
  const int odd = world.size() - 1;
  try {
    train_model(world, d,
                {world.rank() == odd ? ReduceStrategy::Root : ReduceStrategy::Allreduce, 0, true});
    ADD_FAILURE() << "rank " << world.rank() << " trained with a mismatched strategy";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("rank(s) {} differs from rank 0's", odd)));
  }
}
