// The Trainer's prefetch thread and augmentation: preparing each batch on a thread of its own
// trains bitwise what gathering on the main thread trains (with and without augmentation, with
// accumulation, thread replicas, deterministic micro-shards and a ragged last batch), a stop
// in the middle of an epoch drops the prepared batch, an error while preparing (or in a step
// while the thread prepares the next) ends train_epoch with the error, and the epoch reports
// its data times.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "minidl/core/threading.hpp"
#include "minidl/frontend/trainer.hpp"
#include "support/error_of.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"

using namespace minidl;
using minidl::testing::blobs;
using minidl::testing::error_of;
using minidl::testing::same_bits;
using ::testing::HasSubstr;

namespace {

std::unique_ptr<nn::Sequential> cnn() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv1", 1, 4, 3, 1, 1, nn::Init::He);
  m->emplace<nn::ReLU>("relu1");
  m->emplace<nn::MaxPool2d>("pool1", 2);
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc", 64, 10, nn::Init::Xavier);
  return m;
}

struct TrainRun {
  NamedTensors parameters;
  std::vector<EpochStats> epochs;
};

// Two epochs of 300 samples (batches of 32: the last one ragged, 12 samples) on the CNN with
// SGD and momentum.
TrainRun train_two_epochs(TrainerOptions o) {
  const Dataset d = blobs(300, 21);
  auto model = cnn();
  model->reset(7);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
  o.seed = 3;
  Trainer t(*model, sgd, o);
  TrainRun r;
  for (int e = 1; e <= 2; ++e) r.epochs.push_back(t.train_epoch(d, e));
  for (const auto& [name, p] : model->parameters()) r.parameters.emplace_back(name, p.clone());
  return r;
}

}  // namespace

TEST(Prefetch, TrainsBitwiseWhatTheMainThreadTrains) {
  const int threads = max_threads();
  set_num_threads(2);
  struct Case {
    const char* name;
    TrainerOptions options;
  };
  const train::Augment both{.crop = true, .flip = true};
  const std::vector<Case> cases{
      {"plain", {.batch_size = 32}},
      {"augmented", {.batch_size = 32, .augment = both}},
      {"crop only", {.batch_size = 32, .augment = {.crop = true}}},
      {"accumulating", {.batch_size = 16, .accumulate = 3, .augment = both}},
      {"replicas", {.batch_size = 32, .replicas = 2, .augment = both}},
      {"replicas accumulating", {.batch_size = 16, .accumulate = 2, .replicas = 2}},
      {"deterministic", {.batch_size = 32, .micro_batch = 4, .augment = both}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TrainerOptions on = c.options, off = c.options;
    on.prefetch = true;
    off.prefetch = false;
    const TrainRun a = train_two_epochs(on), b = train_two_epochs(off);
    EXPECT_TRUE(same_bits(a.parameters, b.parameters));
    for (std::size_t e = 0; e < a.epochs.size(); ++e) {
      EXPECT_EQ(a.epochs[e].loss, b.epochs[e].loss);
      EXPECT_EQ(a.epochs[e].samples, 300);
    }
  }
  set_num_threads(threads);
}

// The check above must be able to fail: augmentation does change what is trained, and so does
// another seed of its draws.
TEST(Prefetch, AugmentationChangesTheResult) {
  const TrainRun plain = train_two_epochs({.batch_size = 32});
  const TrainRun augmented =
      train_two_epochs({.batch_size = 32, .augment = {.crop = true, .flip = true}});
  EXPECT_FALSE(same_bits(plain.parameters, augmented.parameters));
  EXPECT_NE(plain.epochs[0].loss, augmented.epochs[0].loss);
}

TEST(Prefetch, EpochsReportTheirDataTimes) {
  for (const bool prefetch : {true, false}) {
    const TrainRun r =
        train_two_epochs({.batch_size = 32, .augment = {.crop = true}, .prefetch = prefetch});
    for (const EpochStats& s : r.epochs) {
      EXPECT_GT(s.data_prepare_seconds, 0.0) << prefetch;
      EXPECT_GT(s.data_wait_seconds, 0.0) << prefetch;  // at least the copies
      EXPECT_LT(s.data_wait_seconds, s.seconds) << prefetch;
      if (!prefetch) {
        EXPECT_EQ(s.data_wait_seconds, s.data_prepare_seconds);
      }
    }
  }
}

// A stop after step 4 of an epoch leaves the batch prepared for step 5 unused; resuming from
// the position trains what an uninterrupted run trains.
TEST(Prefetch, AStopMidEpochDropsThePreparedBatch) {
  const Dataset d = blobs(300, 21);
  const TrainerOptions o{.batch_size = 32, .seed = 3, .augment = {.crop = true, .flip = true}};
  auto whole = cnn(), stopped = cnn();
  whole->reset(7);
  stopped->reset(7);
  optim::Sgd a({.lr = 0.05}), b({.lr = 0.05});
  Trainer ta(*whole, a, o), tb(*stopped, b, o);
  ta.train_epoch(d, 1);
  const EpochStats part = tb.train_epoch(d, 1, [&](const StepInfo& info) {
    if (info.step == 4) tb.request_stop();
  });
  EXPECT_EQ(part.samples, 4 * 32);
  tb.resume(tb.position());
  tb.train_epoch(d, 1);
  EXPECT_TRUE(same_bits(whole->parameters(), stopped->parameters()));
}

// An error while preparing a batch, on the prefetch thread or the main one, ends train_epoch
// with that error, prefixed with the step it was for; nothing hangs, and the trainer can go
// on.
TEST(Prefetch, AnErrorWhilePreparingEndsTheEpochWithIt) {
  const Dataset d = blobs(300, 21);
  for (const bool prefetch : {true, false}) {
    for (const std::int64_t accumulate : {1, 2}) {
      const std::int64_t steps = Trainer::steps_per_epoch(300, 32 * accumulate, 1);
      for (const std::int64_t failing : {std::int64_t{1}, std::int64_t{4}, steps}) {
        SCOPED_TRACE(::testing::Message() << "prefetch " << prefetch << ", accumulate "
                                          << accumulate << ", failing step " << failing);
        auto model = cnn();
        model->reset(7);
        optim::Sgd sgd({.lr = 0.05});
        Trainer t(*model, sgd,
                  {.batch_size = 32,
                   .accumulate = accumulate,
                   .augment = {.flip = true},
                   .prefetch = prefetch,
                   .fail_preparing_step = failing});
        std::int64_t steps_done = 0;
        const std::string error = error_of(
            [&] { t.train_epoch(d, 1, [&](const StepInfo& info) { steps_done = info.step; }); });
        EXPECT_THAT(error, HasSubstr(fmt::format("training step {} (epoch 1, step {} of the "
                                                 "epoch): preparing the batch of training step "
                                                 "{} failed",
                                                 failing, failing, failing)));
        EXPECT_EQ(steps_done, failing - 1);
      }
    }
  }
}

// A step that fails while the prefetch thread prepares the next batch: the error is the
// step's, and the thread is joined.
TEST(Prefetch, AStepFailingWhileTheNextBatchIsPreparedEndsCleanly) {
  const Dataset d = blobs(300, 21);
  auto model = cnn();
  model->reset(7);
  optim::Sgd sgd({.lr = 0.05});
  Trainer t(*model, sgd, {.batch_size = 32, .augment = {.crop = true}});
  EXPECT_THAT(error_of([&] {
                t.train_epoch(d, 1, [&](const StepInfo& info) {
                  if (info.step == 3) throw Error("the callback of step 3 failed");
                });
              }),
              HasSubstr("the callback of step 3 failed"));
  // A diverging step (the loss checked every step) ends it the same way.
  for (auto& [name, p] : model->parameters())
    p.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(error_of([&] { t.train_epoch(d, 1); }), HasSubstr("training step 4"));
}

TEST(Prefetch, AugmentingSamplesThatAreNotImagesIsRefused) {
  Dataset flat = blobs(64, 2);
  flat.images = flat.images.reshaped({64, 64});
  auto model = minidl::testing::small_mlp();
  model->reset(1);
  optim::Sgd sgd({.lr = 0.05});
  Trainer t(*model, sgd, {.batch_size = 32, .augment = {.flip = true}});
  EXPECT_THAT(error_of([&] { t.train_epoch(flat, 1); }),
              HasSubstr("augmentation (flip) needs f32 image samples [N, C, H, W], but the "
                        "samples of 'blobs' are f32 [64,64]"));
}
