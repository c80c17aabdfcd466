// The checkpoint format: old checkpoints are pruned and the newest found; loading names every
// tensor that does not match; settings that would change the rest of an epoch are refused.
// (Resuming a Trainer from a checkpoint: tests/frontend/test_resume.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "minidl/core/error.hpp"
#include "minidl/io/checkpoint.hpp"
#include "minidl/io/safetensors.hpp"
#include "minidl/train/optimizer.hpp"
#include "support/error_of.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
using minidl::testing::same_bits;

using minidl::testing::TempDir;

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

using minidl::testing::error_of;

NamedTensors clone(const NamedTensors& v) {
  NamedTensors out;
  for (const auto& [n, t] : v) out.emplace_back(n, t.clone());
  return out;
}

TEST(Checkpoint, KeepsTheNewestKAndResolvesTheNewest) {
  TempDir dir;
  auto model = testing::small_mlp();
  optim::Sgd sgd({.lr = 0.1});
  // Written out of name order on purpose: e0002 must count as newer than e0000-s000123.
  const std::vector<std::pair<int, std::int64_t>> at = {{0, 5}, {0, 123}, {1, 0}, {2, 0}, {2, 7}};
  // A temporary file a killed writer left behind.
  std::fclose(std::fopen((dir.path / "ckpt-e0000-s000001.safetensors.tmp").c_str(), "w"));
  std::fclose(std::fopen((dir.path / "ckpt-e0000-s000002.safetensors.tmp.aB3dE9").c_str(), "w"));
  for (const auto& [epochs, steps] : at) {
    checkpoint::Position p{.epoch = epochs + 1, .epoch_step = steps, .next_sample = steps * 32};
    p.samples = p.next_sample;
    p.step = 100 * epochs + steps;
    checkpoint::save(dir.str(), p, {model->parameters(), {}, sgd.state()}, {}, 3);
  }
  std::vector<std::string> left;
  for (const std::string& p : checkpoint::list(dir.str()))
    left.push_back(fs::path(p).filename().string());
  EXPECT_THAT(left, ::testing::ElementsAre("ckpt-e0001-s000000.safetensors",
                                           "ckpt-e0002-s000000.safetensors",
                                           "ckpt-e0002-s000007.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-e0000-s000001.safetensors.tmp"));
  EXPECT_FALSE(fs::exists(dir.path / "ckpt-e0000-s000002.safetensors.tmp.aB3dE9"));
  EXPECT_EQ(checkpoint::resolve(dir.str()), (dir.path / "ckpt-e0002-s000007.safetensors").string());
  TempDir empty_dir_holder;
  const fs::path empty = empty_dir_holder.path / "empty";
  fs::create_directories(empty);
  EXPECT_THAT(error_of([&] { checkpoint::resolve(empty.string()); }),
              HasSubstr("holds no checkpoint"));
}

// --- What loading says when the file does not match ---

struct LoadCase {
  TempDir dir;
  std::string path;
  /// Saves a checkpoint of `model` with an optimizer of the given momentum.
  void save(nn::Module& model, double momentum) {
    optim::Sgd sgd({.lr = 0.1, .momentum = momentum});
    sgd.init_state(model.parameters());
    path = checkpoint::save(dir.str(), checkpoint::Position{},
                            {model.parameters(), model.buffers(), sgd.state()}, {}, 1);
  }
  std::string load_error(nn::Module& model, double momentum) {
    optim::Sgd sgd({.lr = 0.1, .momentum = momentum});
    sgd.init_state(model.parameters());
    return error_of([&] {
      checkpoint::load(path, {model.parameters(), model.buffers(), sgd.state()});
    });
  }
};

std::unique_ptr<nn::Sequential> mlp(std::int64_t hidden, const std::string& last = "fc2") {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 64, hidden);
  m->emplace<nn::ReLU>("act1");
  m->emplace<nn::Linear>(last, hidden, 10);
  return m;
}

TEST(CheckpointLoad, WrongNameSaysWhichIsMissingAndWhichIsUnexpected) {
  LoadCase c;
  c.save(*mlp(32, "out"), 0.0);
  const std::string e = c.load_error(*mlp(32, "fc2"), 0.0);
  EXPECT_THAT(e, HasSubstr("checkpoint '" + c.path + "' does not match this model and optimizer"));
  EXPECT_THAT(e, HasSubstr("tensor 'fc2.weight' is missing (expected F32 [10,32], a parameter of "
                           "the model)"));
  EXPECT_THAT(e, HasSubstr("unexpected tensor 'out.weight' F32 [10,32] (the model has no such "
                           "parameter or buffer)"));
  EXPECT_THAT(e, Not(HasSubstr("fc1")));  // only what differs
}

TEST(CheckpointLoad, WrongShapeSaysExpectedAndFound) {
  LoadCase c;
  c.save(*mlp(32), 0.9);
  const std::string e = c.load_error(*mlp(16), 0.9);
  EXPECT_THAT(e, HasSubstr("tensor 'fc1.weight': expected F32 [16,64], found F32 [32,64]"));
  EXPECT_THAT(e, HasSubstr("tensor 'fc2.weight': expected F32 [10,16], found F32 [10,32]"));
  EXPECT_THAT(e, HasSubstr("tensor 'optimizer.fc1.weight.momentum_buffer': expected F32 [16,64], "
                           "found F32 [32,64]"));
}

TEST(CheckpointLoad, WrongDtypeSaysExpectedAndFound) {
  LoadCase c;
  auto model = mlp(32);
  c.save(*model, 0.0);
  // Rewrite the file with fc2.bias as integers, the metadata kept.
  SafetensorsFile f = load_safetensors(c.path);
  for (auto& [n, t] : f.tensors)
    if (n == "fc2.bias") t = Tensor::zeros({10}, DType::I32);
  save_safetensors(c.path, f.tensors, f.metadata);
  EXPECT_THAT(c.load_error(*model, 0.0),
              HasSubstr("tensor 'fc2.bias': expected F32 [10], found I32 [10]"));
}

TEST(CheckpointLoad, MissingOptimizerStateIsNamed) {
  LoadCase c;
  auto model = mlp(32);
  c.save(*model, 0.0);  // plain SGD: no state in the file
  const std::string e = c.load_error(*model, 0.9);
  EXPECT_THAT(e, HasSubstr("tensor 'optimizer.fc1.weight.momentum_buffer' is missing (expected "
                           "F32 [32,64], optimizer state)"));
  EXPECT_THAT(e, HasSubstr("tensor 'optimizer.fc2.bias.momentum_buffer' is missing"));
  // The other way round: state the optimizer does not keep.
  c.save(*model, 0.9);
  EXPECT_THAT(c.load_error(*model, 0.0),
              HasSubstr("unexpected tensor 'optimizer.fc1.weight.momentum_buffer' F32 [32,64] "
                        "(this optimizer keeps no such state)"));
}

TEST(CheckpointLoad, PlainParameterFileIsNotACheckpoint) {
  TempDir dir;
  auto model = mlp(32);
  const std::string path = (dir.path / "model.safetensors").string();
  save_safetensors(path, model->parameters(), {{"format", "pt"}});
  optim::Sgd sgd({.lr = 0.1});
  EXPECT_THAT(error_of([&] {
                checkpoint::load(path, {model->parameters(), {}, sgd.state()});
              }),
              HasSubstr("'" + path + "' is not a minidl checkpoint"));
}

TEST(CheckpointLoad, NothingIsCopiedWhenSomethingDiffers) {
  LoadCase c;
  auto saved = mlp(32);
  saved->reset(1);
  c.save(*saved, 0.0);
  auto model = mlp(32, "out");
  model->reset(2);
  const NamedTensors before = clone(model->parameters());
  (void)c.load_error(*model, 0.0);
  EXPECT_TRUE(same_bits(before, model->parameters()));
}

// --- Settings of the resuming run ---

checkpoint::Loaded loaded_at(std::int64_t epoch_step, checkpoint::Metadata m) {
  checkpoint::Loaded l;
  l.path = "run/ckpt.safetensors";
  l.position.epoch = 2;
  l.position.epoch_step = epoch_step;
  l.metadata = std::move(m);
  return l;
}

TEST(CheckpointSettings, SeedOrBatchChangeIsRefusedMidEpochAndNotedAtABoundary) {
  using R = checkpoint::Rule;
  const std::vector<checkpoint::Setting> run = {
      {"seed", "8", R::SameMidEpoch, "--seed"},
      {"batch_size", "64", R::SameMidEpoch, "--batch-size"},
      {"ranks", "2", R::Note, "the number of ranks"},
      {"model", "M", R::Same, "the model"}};
  const checkpoint::Metadata m = {
      {"seed", "7"}, {"batch_size", "64"}, {"ranks", "1"}, {"model", "M"}};
  const std::string e = error_of([&] { checkpoint::check_settings(loaded_at(5, m), run); });
  EXPECT_THAT(e, HasSubstr("checkpoint 'run/ckpt.safetensors' (taken 5 steps into epoch 2) does "
                           "not fit this run: --seed is 7 in the checkpoint, 8 here"));
  EXPECT_THAT(e, Not(HasSubstr("--batch-size")));  // equal
  EXPECT_THAT(e, Not(HasSubstr("ranks")));         // a note, not a refusal

  const std::vector<std::string> notes = checkpoint::check_settings(loaded_at(0, m), run);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_THAT(notes[0], HasSubstr("--seed is 7 in the checkpoint, 8 here (the checkpoint is at "
                                  "an epoch boundary"));
  EXPECT_THAT(notes[1], HasSubstr("the number of ranks is 1 in the checkpoint, 2 here"));

  checkpoint::Metadata other = m;
  other["model"] = "N";
  EXPECT_THAT(error_of([&] { checkpoint::check_settings(loaded_at(0, other), run); }),
              HasSubstr("the model is N in the checkpoint, M here"));
}

}  // namespace
}  // namespace minidl
