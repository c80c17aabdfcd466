// train::predict, inference without a loss: the forward computed by hand, the classes the
// evaluation program counts as correct, dropout off, and bad samples named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "minidl/train/batch.hpp"
#include "minidl/train/predict.hpp"
#include "support/error_of.hpp"
#include "support/synthetic.hpp"

using namespace minidl;
using minidl::testing::blobs;
using minidl::testing::error_of;
using minidl::testing::small_mlp;
using ::testing::HasSubstr;

TEST(Predict, ComputesTheForwardOfTheModel) {
  const Dataset d = blobs(5, 1);
  auto model = small_mlp();
  model->reset(3);
  const Tensor logits = train::predict(*model, d.images);
  ASSERT_EQ(logits.shape(), (Shape{5, 10}));
  const NamedTensors p = model->parameters();  // fc1.weight [32,64], fc1.bias, fc2.weight, fc2.bias
  for (std::int64_t i = 0; i < 5; ++i) {
    double hidden[32];
    for (int h = 0; h < 32; ++h) {
      double s = p[1].second.at(h);
      for (int k = 0; k < 64; ++k) s += p[0].second.at(h * 64 + k) * d.images.at(i * 64 + k);
      hidden[h] = std::max(s, 0.0);
    }
    for (int c = 0; c < 10; ++c) {
      double s = p[3].second.at(c);
      for (int h = 0; h < 32; ++h) s += p[2].second.at(c * 32 + h) * hidden[h];
      EXPECT_NEAR(logits.at(i * 10 + c), s, 1e-4) << "sample " << i << ", class " << c;
    }
  }
}

TEST(Predict, ItsClassesAreWhatEvaluationCountsAsCorrect) {
  const Dataset d = blobs(50, 2);
  auto model = small_mlp();
  model->reset(4);
  const std::vector<std::int64_t> classes =
      train::predicted_classes(train::predict(*model, d.images));
  std::int64_t right = 0;
  for (std::int64_t i = 0; i < d.size(); ++i)
    right += classes[static_cast<std::size_t>(i)] == d.labels.data<std::int32_t>()[i];
  const train::CrossEntropy loss;
  train::CompiledStep eval = train::compile_step(
      *model, loss, nullptr, {.sample = Shape{1, 8, 8}, .batch = 50, .train = false}, {});
  std::vector<std::int64_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  train::gather(eval, d.images, d.labels, all);
  eval.run();
  EXPECT_EQ(right, eval.correct());
}

TEST(Predict, DropoutIsTheIdentity) {
  const Dataset d = blobs(6, 3);
  nn::Sequential with;
  with.emplace<nn::Flatten>("flatten");
  with.emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
  with.emplace<nn::ReLU>("act1");
  with.emplace<nn::Dropout>("drop", 0.5);
  with.emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
  with.reset(5);
  auto without = small_mlp();
  nn::load_state_dict(*without, with.state_dict(), "the model with dropout");
  const Tensor a = train::predict(with, d.images), b = train::predict(*without, d.images);
  for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.at(i), b.at(i)) << i;
}

TEST(Predict, NamesBadSamplesAndScores) {
  auto model = small_mlp();
  EXPECT_THAT(error_of([&] {
                train::predict(*model, Tensor::zeros({0, 1, 8, 8}));
              }),
              HasSubstr("predict: expected f32 samples [N, ...] with N >= 1, got f32 [0,1,8,8]"));
  EXPECT_THAT(error_of([&] {
                train::predict(*model, Tensor::zeros({2, 64}, DType::I32));
              }),
              HasSubstr("got i32 [2,64]"));
  EXPECT_THAT(error_of([&] {
                train::predict(*model, Tensor::zeros({2, 1, 4, 4}));
              }),
              HasSubstr("4"));
  EXPECT_THAT(error_of([&] { train::predicted_classes(Tensor::zeros({10})); }),
              HasSubstr("expected f32 scores [N, classes], got f32 [10]"));
}
