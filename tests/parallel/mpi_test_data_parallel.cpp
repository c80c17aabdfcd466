// TrainedModel under mpirun (ctest does, with 2 and 3 ranks): data-parallel training at a global
// batch matches a serial run of the same batch inside the same process, every rank holds
// bitwise-identical parameters, and a ragged last batch trains without a hang.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "minidl/frontend/trainer.hpp"
#include "minidl/parallel/communicator.hpp"
#include "parallel/dp_support.hpp"
#include "support/modules.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"

using namespace minidl;

namespace {

struct TrainedModel {
  std::unique_ptr<nn::Sequential> model;
  EpochStats last;
};

TrainedModel train_model(parallel::Communicator& comm, const Dataset& d, int epochs,
                         double momentum) {
  TrainedModel r{minidl::testing::small_mlp(), {}};
  r.model->reset(7);
  optim::Sgd sgd({.lr = 0.05, .momentum = momentum});
  Trainer t(*r.model, sgd, {.batch_size = 32, .seed = 3, .comm = &comm});
  for (int e = 1; e <= epochs; ++e) r.last = t.train_epoch(d, e);
  return r;
}

// Every rank compares its parameters with rank 0's, bit for bit; all ranks learn the verdict.
std::int64_t ranks_that_differ(parallel::Communicator& comm, nn::Module& m) {
  std::int64_t differ = 0;
  for (auto& [name, t] : m.parameters()) {
    Tensor mine = t.clone();
    Tensor root = t.clone();
    comm.broadcast(root.raw(), root.nbytes(), 0);
    differ |= std::memcmp(mine.raw(), root.raw(), mine.nbytes()) != 0;
  }
  comm.allreduce_sum(&differ, 1);
  return differ;
}

void expect_close(nn::Module& a, nn::Module& b, double rtol) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t k = 0; k < pa.size(); ++k) {
    double worst = 0.0;
    for (std::int64_t i = 0; i < pa[k].second.numel(); ++i) {
      const double x = pa[k].second.at(i), y = pb[k].second.at(i);
      worst = std::max(worst, std::fabs(x - y) / (1e-3 + std::fabs(y)));
    }
    EXPECT_LT(worst, rtol) << pa[k].first;
  }
}

}  // namespace

TEST(DataParallel, MatchesSerialAtTheSameGlobalBatch) {
  parallel::Communicator& world = parallel::world();
  ASSERT_GT(world.size(), 1) << "run this test under mpirun with at least 2 ranks";
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(1024, 11);
  TrainedModel par = train_model(world, d, 2, 0.9);
  TrainedModel ser = train_model(*local, d, 2, 0.9);
  expect_close(*par.model, *ser.model, 1e-4);
  EXPECT_NEAR(par.last.loss, ser.last.loss, 1e-5);
  EXPECT_EQ(par.last.samples, ser.last.samples);
  EXPECT_EQ(ranks_that_differ(world, *par.model), 0);
}

// A buffer is read by every rank's graph and left out of the gradient reduction: the model
// trains as the serial one does, and the buffer stays what every rank set it to.
TEST(DataParallel, BuffersAreReadButNotReduced) {
  parallel::Communicator& world = parallel::world();
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(512, 15);
  auto run = [&](parallel::Communicator& comm) {
    auto model = minidl::testing::shifted_mlp();
    const Tensor initial = model->buffers()[0].second.clone();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd, {.batch_size = 32, .seed = 3, .comm = &comm});
    const ir::Node* b = t.training_graph(Shape{1, 8, 8}).find("shift.offset");
    EXPECT_NE(b, nullptr);
    if (b != nullptr) {
      for (const ir::Node* user : b->output()->users())
        EXPECT_EQ(user->phase(), ir::Phase::Forward) << user->describe();
    }
    t.train_epoch(d, 1);
    const Tensor offset = model->buffers()[0].second;
    EXPECT_EQ(std::memcmp(offset.raw(), initial.raw(), offset.nbytes()), 0);
    return model;
  };
  auto par = run(world);
  auto ser = run(*local);
  expect_close(*par, *ser, 1e-4);
  EXPECT_EQ(ranks_that_differ(world, *par), 0);
}

// A model reading a sum over the whole global batch (cross_replica_sum): each rank's part is
// reduced across the ranks, in the forward and in the backward. Deterministic mode sums in the
// fixed tree, so the ranks' parameters have the serial run's bits.
TEST(DataParallel, CrossReplicaSumsCoverTheGlobalBatch) {
  parallel::Communicator& world = parallel::world();
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(200, 16);  // 6 batches of 32 and one of 8
  auto run = [&](parallel::Communicator& comm, std::int64_t micro_batch) {
    auto model = minidl::testing::globally_shifted_mlp();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd,
              {.batch_size = 32, .seed = 3, .micro_batch = micro_batch, .comm = &comm});
    t.train_epoch(d, 1);
    return model;
  };
  auto par = run(world, 0);
  auto ser = run(*local, 0);
  expect_close(*par, *ser, 1e-4);
  EXPECT_EQ(ranks_that_differ(world, *par), 0);
  // Micro-shards of 2: the last batch of 8 still gives each of 3 ranks one.
  auto det_par = run(world, 2);
  auto det_ser = run(*local, 2);
  EXPECT_TRUE(minidl::testing::bitwise_equal(*det_par, *det_ser));
}

// BatchNorm over ranks: with --sync-bn the statistics are the global batch's, so the model
// trains as the serial one; deterministic mode gives its bits, running statistics included.
// Without it each rank normalises by its share, and the running statistics are still the
// global batch's: every rank holds the same.
TEST(DataParallel, BatchNormStatisticsAcrossRanks) {
  parallel::Communicator& world = parallel::world();
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(200, 17);
  auto run = [&](parallel::Communicator& comm, std::int64_t micro_batch, bool sync) {
    auto model = std::make_unique<nn::Sequential>();
    model->emplace<nn::Flatten>("flatten");
    model->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
    model->emplace<nn::BatchNorm1d>("bn1", 32);
    model->emplace<nn::ReLU>("act1");
    model->emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
    model->reset(4);
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd,
              {.batch_size = 32,
               .seed = 3,
               .micro_batch = micro_batch,
               .comm = &comm,
               .sync_batch_stats = sync});
    t.train_epoch(d, 1);
    return model;
  };
  auto same_state = [](nn::Module& a, nn::Module& b) {
    return minidl::testing::same_bits(a.state_dict(), b.state_dict());
  };
  auto par = run(world, 0, true);
  auto ser = run(*local, 0, true);
  expect_close(*par, *ser, 1e-4);
  EXPECT_EQ(ranks_that_differ(world, *par), 0);
  EXPECT_TRUE(same_state(*run(world, 2, true), *run(*local, 2, true)));
  // Per-rank statistics: another model than the serial one, the same on every rank.
  auto per_rank = run(world, 0, false);
  EXPECT_EQ(ranks_that_differ(world, *per_rank), 0);
  std::int64_t differ = 0;
  for (auto& [name, t] : per_rank->buffers()) {
    Tensor root = t.clone();
    world.broadcast(root.raw(), root.nbytes(), 0);
    differ |= std::memcmp(t.raw(), root.raw(), t.nbytes()) != 0;
  }
  EXPECT_EQ(differ, 0) << "the running statistics differ between ranks";
}

// 1000 = 31 * 32 + 8: the last global batch of 8 is split unevenly for 3 ranks (3/3/2).
TEST(DataParallel, RaggedLastBatch) {
  parallel::Communicator& world = parallel::world();
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(1000, 12);
  TrainedModel par = train_model(world, d, 1, 0.0);
  TrainedModel ser = train_model(*local, d, 1, 0.0);
  EXPECT_EQ(par.last.samples, 1000);
  expect_close(*par.model, *ser.model, 1e-4);
  EXPECT_EQ(ranks_that_differ(world, *par.model), 0);
}

TEST(DataParallel, EvaluationCoversTheWholeSet) {
  parallel::Communicator& world = parallel::world();
  auto local = parallel::make_local_communicator();
  const Dataset d = minidl::testing::blobs(999, 13);
  auto model = minidl::testing::small_mlp();
  model->reset(1);
  optim::Sgd sgd({.lr = 0.05});
  Trainer par(*model, sgd, {.comm = &world});
  Trainer ser(*model, sgd, {.comm = local.get()});
  const EvalStats a = par.evaluate(d), b = ser.evaluate(d);
  EXPECT_EQ(a.samples, 999);
  EXPECT_DOUBLE_EQ(a.accuracy, b.accuracy);
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
}

// Rank 1 builds a wider model: every rank fails in preflight, naming the difference, instead of
// hanging in the first allreduce.
TEST(DataParallel, PreflightCatchesADifferentModelOnOneRank) {
  parallel::Communicator& world = parallel::world();
  const Dataset d = minidl::testing::blobs(256, 14);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Flatten>("flatten");
  model->emplace<nn::Linear>("fc1", 64, world.rank() == 1 ? 48 : 32, nn::Init::He);
  model->emplace<nn::ReLU>("act1");
  model->emplace<nn::Linear>("fc2", world.rank() == 1 ? 48 : 32, 10, nn::Init::Xavier);
  model->reset(1);
  optim::Sgd sgd({.lr = 0.05});
  Trainer t(*model, sgd, {.batch_size = 32, .comm = &world});
  try {
    t.train_epoch(d, 1);
    ADD_FAILURE() << "rank " << world.rank() << " trained with a mismatched model";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("preflight: the training set-up of rank(s) 1 differs from rank 0's"),
              std::string::npos)
        << what;
    if (world.rank() == 1) {
      EXPECT_NE(what.find("rank 0 has 'parameter fc1.weight [32,64] f32', rank 1 has "
                          "'parameter fc1.weight [48,64] f32'"),
                std::string::npos)
          << what;
    }
  }
}
