// Resuming the Trainer from a checkpoint: a run resumed at an epoch boundary or in the middle
// of an epoch (with momentum and dropout) ends with bitwise the same parameters as one that
// never stopped, and losing any part of the state changes the result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "minidl/core/error.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/io/checkpoint.hpp"
#include "minidl/io/safetensors.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
using minidl::testing::same_bits;

using minidl::testing::TempDir;

namespace {

namespace fs = std::filesystem;

/// 64 -> 32 -> dropout -> 10 over [N,1,8,8]: dropout makes the step counter part of the state.
std::unique_ptr<nn::Sequential> mlp_with_dropout() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
  m->emplace<nn::ReLU>("act1");
  m->emplace<nn::Dropout>("drop", 0.25);
  m->emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
  return m;
}

TrainerOptions options(const train::Augment& augment = {}) {
  // 200 samples in batches of 32: 7 steps per epoch, the last one ragged (8 samples).
  return {.batch_size = 32, .eval_batch_size = 100, .seed = 11, .augment = augment};
}

NamedTensors clone(const NamedTensors& v) {
  NamedTensors out;
  for (const auto& [n, t] : v) out.emplace_back(n, t.clone());
  return out;
}

/// Trains `epochs` epochs without a stop; returns the parameters and the last epoch's stats.
std::pair<NamedTensors, EpochStats> uninterrupted(const Dataset& d, int epochs,
                                                  const train::Augment& augment = {}) {
  auto model = mlp_with_dropout();
  model->reset(3);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
  Trainer t(*model, sgd, options(augment));
  EpochStats last;
  for (int e = 1; e <= epochs; ++e) last = t.train_epoch(d, e);
  return {clone(model->parameters()), last};
}

/// Trains until the checkpoint taken after `stop_step` training steps, "dies", and resumes in
/// a fresh model, optimizer and trainer from that checkpoint's directory.
std::pair<NamedTensors, EpochStats> interrupted(const Dataset& d, int epochs,
                                                std::int64_t stop_step, const std::string& dir,
                                                const train::Augment& augment = {}) {
  {
    auto model = mlp_with_dropout();
    model->reset(3);
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd, options(augment));
    bool stopped = false;
    auto on_step = [&](const StepInfo& info) {
      if (info.step != stop_step) return;
      checkpoint::save(dir, t.position(), {model->parameters(), {}, sgd.state()}, {}, 2);
      stopped = true;
      throw Error("stop");  // the process dies here
    };
    try {
      for (int e = 1; e <= epochs; ++e) t.train_epoch(d, e, on_step);
    } catch (const Error&) {
    }
    EXPECT_TRUE(stopped);
  }
  auto model = mlp_with_dropout();
  // The same seed (it also seeds dropout), but parameters the checkpoint must overwrite.
  model->reset(3);
  for (auto& [n, t] : model->parameters()) std::fill_n(t.data<float>(), t.numel(), 7.0f);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
  Trainer t(*model, sgd, options(augment));
  const checkpoint::Loaded ckpt =
      checkpoint::load(checkpoint::resolve(dir), {model->parameters(), {}, sgd.state()});
  t.resume(ckpt.position);
  EpochStats last;
  for (int e = ckpt.position.epoch; e <= epochs; ++e) last = t.train_epoch(d, e);
  return {clone(model->parameters()), last};
}

TEST(Checkpoint, ResumeMidEpochIsBitwiseIdentical) {
  const Dataset d = testing::blobs(200, 31);
  TempDir dir;
  const auto [a, sa] = uninterrupted(d, 2);
  const auto [b, sb] = interrupted(d, 2, 10, dir.str());  // 3 steps into epoch 2
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-e0001-s000003.safetensors"));
  EXPECT_TRUE(same_bits(a, b));
  // The epoch's statistics carry over the stop too (up to the order of the sums).
  EXPECT_EQ(sb.samples, 200);
  EXPECT_NEAR(sa.loss, sb.loss, 1e-9);
  EXPECT_DOUBLE_EQ(sa.accuracy, sb.accuracy);
}

// Augmentation draws from (seed, epoch, sample): the resumed run draws the rest of the epoch's
// transforms again.
TEST(Checkpoint, ResumeMidEpochWithAugmentationIsBitwiseIdentical) {
  const Dataset d = testing::blobs(200, 34);
  TempDir dir;
  const train::Augment both{.crop = true, .flip = true};
  const auto [a, sa] = uninterrupted(d, 2, both);
  const auto [b, sb] = interrupted(d, 2, 10, dir.str(), both);
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_FALSE(same_bits(a, uninterrupted(d, 2).first));  // the augmentation did something
}

TEST(Checkpoint, ResumeAtEpochBoundaryIsBitwiseIdentical) {
  const Dataset d = testing::blobs(200, 32);
  TempDir dir;
  const auto [a, sa] = uninterrupted(d, 3);
  const auto [b, sb] = interrupted(d, 3, 7, dir.str());  // the last (ragged) step of epoch 1
  EXPECT_TRUE(fs::exists(dir.path / "ckpt-e0000-s000007.safetensors"));
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_EQ(sa.loss, sb.loss);
}

// The test must be able to fail: a resume that forgets the momentum buffers or the step
// counter (dropout's key) ends elsewhere.
TEST(Checkpoint, LosingStateChangesTheResult) {
  const Dataset d = testing::blobs(200, 33);
  TempDir dir;
  const auto [a, sa] = uninterrupted(d, 2);
  (void)interrupted(d, 2, 10, dir.str());
  const std::string file = checkpoint::resolve(dir.str());
  for (const std::string lose : {"nothing", "momentum", "step"}) {
    auto model = mlp_with_dropout();
    model->reset(3);
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd, options());
    checkpoint::Loaded ckpt = checkpoint::load(file, {model->parameters(), {}, sgd.state()});
    if (lose == "momentum") {
      for (auto& [n, v] : sgd.state()) std::memset(v.raw(), 0, v.nbytes());
    } else if (lose == "step") {
      ckpt.position.step = 0;
    }
    t.resume(ckpt.position);
    t.train_epoch(d, 2);
    EXPECT_EQ(same_bits(a, model->parameters()), lose == "nothing") << "losing " << lose;
  }
}

TEST(Checkpoint, FileHoldsParametersStateAndPosition) {
  TempDir dir;
  auto model = testing::small_mlp();
  model->reset(1);
  optim::Sgd sgd({.lr = 0.1, .momentum = 0.5});
  Trainer t(*model, sgd, options());
  t.train_epoch(testing::blobs(64, 1), 1);
  const std::string path = checkpoint::save(
      dir.str(), t.position(), {model->parameters(), {}, sgd.state()}, {{"seed", "11"}}, 3);
  EXPECT_EQ(path, (dir.path / "ckpt-e0001-s000000.safetensors").string());
  const SafetensorsFile f = load_safetensors(path);
  std::vector<std::string> names;
  for (const auto& [n, v] : f.tensors) names.push_back(n);
  EXPECT_THAT(names, ::testing::ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                            "optimizer.fc1.weight.momentum_buffer",
                                            "optimizer.fc1.bias.momentum_buffer",
                                            "optimizer.fc2.weight.momentum_buffer",
                                            "optimizer.fc2.bias.momentum_buffer"));
  EXPECT_EQ(f.metadata.at("minidl.checkpoint"), "1");
  EXPECT_EQ(f.metadata.at("epoch"), "1");
  EXPECT_EQ(f.metadata.at("epoch_step"), "0");
  EXPECT_EQ(f.metadata.at("step"), "2");
  EXPECT_EQ(f.metadata.at("seed"), "11");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  // No temporary file is left next to it.
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace minidl
