// train::gather, the feeding half of a hand-written loop: every part of a step gets the indexed
// samples and targets (labels, or the samples themselves), a loop of gather and run trains
// the same parameters as the Trainer, and what does not fit the step is named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "minidl/core/rng.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/train/batch.hpp"
#include "support/error_of.hpp"
#include "support/synthetic.hpp"

using namespace minidl;
using minidl::testing::blobs;
using minidl::testing::error_of;
using minidl::testing::small_mlp;
using ::testing::HasSubstr;

namespace {

train::CompiledStep compile(nn::Module& model, const train::Loss& loss, optim::Optimizer* opt,
                            std::int64_t batch, int replicas = 1) {
  return train::compile_step(model, loss, opt,
                             {.sample = Shape{1, 8, 8}, .batch = batch, .train = opt != nullptr},
                             {.layout = parallel::Layout({.replicas = replicas})});
}

// Whether row j of part's x holds sample i of images [N, 1, 8, 8].
bool holds(const train::CompiledStep::Part& part, std::int64_t j, const Tensor& images,
           std::int64_t i) {
  return std::memcmp(part.x.data<float>() + j * 64, images.data<float>() + i * 64,
                     64 * sizeof(float)) == 0;
}

}  // namespace

TEST(Gather, FillsEveryPartWithTheIndexedSamplesAndLabels) {
  const Dataset d = blobs(40, 1);
  auto model = small_mlp();
  model->reset(1);
  const train::CrossEntropy loss;
  optim::Sgd sgd({.lr = 0.1});
  const std::vector<std::int64_t> order = permutation(d.size(), 9);
  for (const bool training : {true, false}) {
    train::CompiledStep step = compile(*model, loss, training ? &sgd : nullptr, 10, 3);
    EXPECT_EQ(step.parts().size(), training ? 3u : 1u);
    train::gather(step, d.images, d.labels, std::span(order).subspan(5, 10));
    for (const train::CompiledStep::Part& part : step.parts()) {
      for (std::int64_t j = 0; j < part.end - part.begin; ++j) {
        const std::int64_t i = order[static_cast<std::size_t>(5 + part.begin + j)];
        EXPECT_TRUE(holds(part, j, d.images, i)) << "part at " << part.begin << ", row " << j;
        EXPECT_EQ(part.target.data<std::int32_t>()[j], d.labels.data<std::int32_t>()[i]);
      }
    }
  }
}

TEST(Gather, TakesTheSamplesThemselvesAsReconstructionTargets) {
  const Dataset d = blobs(12, 2);
  nn::Sequential model;
  model.emplace<nn::Flatten>("flatten");
  model.emplace<nn::Linear>("fc", 64, 64, nn::Init::Xavier);
  model.reset(2);
  const train::MeanSquaredError loss;
  optim::AdamW adamw({});
  train::CompiledStep step = compile(model, loss, &adamw, 4);
  const std::vector<std::int64_t> batch{11, 0, 7, 3};
  train::gather(step, d.images, d.images, batch);
  const train::CompiledStep::Part& part = step.parts()[0];
  ASSERT_EQ(part.target.shape(), (Shape{4, 64}));
  for (std::int64_t j = 0; j < 4; ++j) {
    EXPECT_TRUE(holds(part, j, d.images, batch[static_cast<std::size_t>(j)]));
    EXPECT_EQ(std::memcmp(part.target.data<float>() + j * 64, part.x.data<float>() + j * 64,
                          64 * sizeof(float)),
              0);
  }
}

// The loop of examples/mnist_loop.cpp against the Trainer's: the same batches in the same order,
// the same learning rate and step count, so the same parameter bits.
TEST(Gather, AHandWrittenLoopTrainsWhatTheTrainerTrains) {
  const Dataset d = blobs(96, 3);
  auto by_hand = small_mlp(), by_trainer = small_mlp();
  by_hand->reset(5);
  by_trainer->reset(5);
  const train::CrossEntropy loss;
  optim::AdamW a({.lr = 0.01}), b({.lr = 0.01});
  train::CompiledStep step = compile(*by_hand, loss, &a, 32);
  std::int64_t steps = 0;
  double loss_sum = 0.0;
  for (int epoch = 1; epoch <= 2; ++epoch) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(d.size()));
    std::iota(order.begin(), order.end(), 0);
    for (std::int64_t start = 0; start < d.size(); start += 32) {
      train::gather(step, d.images, d.labels, std::span(order).subspan(start, 32));
      step.run({.lr = a.lr(), .step = steps++});
      loss_sum += step.loss_sum();
    }
  }
  Trainer trainer(*by_trainer, b, {.batch_size = 32, .shuffle = false});
  double trainer_loss_sum = 0.0;
  for (int epoch = 1; epoch <= 2; ++epoch)
    trainer_loss_sum += trainer.train_epoch(d, epoch).loss * static_cast<double>(d.size());
  EXPECT_NEAR(loss_sum, trainer_loss_sum, 1e-9 * trainer_loss_sum);
  const NamedTensors p = by_hand->parameters(), q = by_trainer->parameters();
  ASSERT_EQ(p.size(), q.size());
  for (std::size_t k = 0; k < p.size(); ++k) {
    EXPECT_EQ(std::memcmp(p[k].second.raw(), q[k].second.raw(), p[k].second.nbytes()), 0)
        << p[k].first;
  }
}

TEST(Gather, NamesWhatDoesNotFitTheStep) {
  const Dataset d = blobs(8, 4);
  auto model = small_mlp();
  const train::CrossEntropy loss;
  train::CompiledStep step = compile(*model, loss, nullptr, 4);
  const std::vector<std::int64_t> batch{0, 1, 2, 3};
  const Tensor small = Tensor::zeros({8, 1, 4, 4});
  EXPECT_THAT(error_of([&] { train::gather(step, small, d.labels, batch); }),
              HasSubstr("the step wants f32 [4,1,8,8] for 4 samples (64 values each), but the "
                        "samples are f32 [8,1,4,4] (16 values each)"));
  const Tensor float_labels = Tensor::zeros({8});
  EXPECT_THAT(error_of([&] { train::gather(step, d.images, float_labels, batch); }),
              HasSubstr("the targets are f32 [8]"));
  const Tensor few_labels = Tensor::zeros({6}, DType::I32);
  EXPECT_THAT(error_of([&] { train::gather(step, d.images, few_labels, batch); }),
              HasSubstr("the targets [6] do not have the samples' 8 rows first"));
  const std::vector<std::int64_t> outside{0, 1, 8, 3};
  EXPECT_THAT(error_of([&] { train::gather(step, d.images, d.labels, outside); }),
              HasSubstr("index 8 at position 2 of the batch is outside the 8 samples"));
  const std::vector<std::int64_t> short_batch{0, 1};
  EXPECT_THAT(error_of([&] { train::gather(step, d.images, d.labels, short_batch); }),
              HasSubstr("this rank takes samples [0, 4) of the batch, but the batch has 2"));
}
