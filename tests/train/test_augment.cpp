// Data augmentation beside train::gather: the transforms' pixels (crop offsets, flips, the zero
// padding), their draws (a pure function of seed, epoch and the sample's index: the same for any
// batch split, another in another epoch), gather and the staged batch writing the same bits,
// and samples that are not images refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <set>

#include "minidl/core/rng.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/train/batch.hpp"
#include "support/error_of.hpp"
#include "support/synthetic.hpp"

using namespace minidl;
using minidl::testing::blobs;
using minidl::testing::error_of;
using minidl::testing::small_mlp;
using ::testing::HasSubstr;

namespace {

// An image [C, H, W] whose pixel (c, y, x) is 1 + 100c + 10y + x: no pixel is 0, so padding
// shows.
Tensor numbered(std::int64_t c, std::int64_t h, std::int64_t w) {
  Tensor t = Tensor::empty({c, h, w});
  for (std::int64_t k = 0; k < c; ++k)
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x)
        t.data<float>()[(k * h + y) * w + x] = static_cast<float>(1 + 100 * k + 10 * y + x);
  return t;
}

float pixel(const Tensor& t, std::int64_t c, std::int64_t y, std::int64_t x) {
  return t.data<float>()[(c * t.shape()[1] + y) * t.shape()[2] + x];
}

Tensor transformed(const train::SampleTransform& tr, const Tensor& image) {
  Tensor out = Tensor::full(image.shape(), -1.0f);
  train::apply_transform(tr, image.data<float>(), out.data<float>(), image.shape());
  return out;
}

train::CompiledStep compile(nn::Module& model, const train::Loss& loss, optim::Optimizer* opt,
                            std::int64_t batch, int replicas = 1, std::int64_t accumulate = 1) {
  return train::compile_step(
      model, loss, opt, {.sample = Shape{1, 8, 8}, .batch = batch, .train = opt != nullptr},
      {.layout = parallel::Layout({.replicas = replicas, .accumulate = accumulate})});
}

// The rows every part of micro-step j holds, in batch order, as one flat vector.
std::vector<float> rows_of(const train::CompiledStep& step, std::size_t j = 0) {
  std::vector<float> out;
  for (const train::CompiledStep::Part& p : step.parts(j))
    out.insert(out.end(), p.x.data<float>(), p.x.data<float>() + p.x.numel());
  return out;
}

}  // namespace

TEST(Augment, ParsesAndDescribesTheFlagsValues) {
  for (const std::string v : {"none", "crop", "flip", "crop,flip"})
    EXPECT_EQ(train::Augment::parse(v).describe(), v);
  EXPECT_FALSE(train::Augment::parse("").any());
  const train::Augment both = train::Augment::parse("crop,flip");
  EXPECT_TRUE(both.crop && both.flip);
  EXPECT_EQ(both.pad, 4);
  for (const std::string bad : {"flip,crop", "crop,", "Crop", "rotate", "crop flip"}) {
    EXPECT_THAT(error_of([&] { train::Augment::parse(bad); }),
                HasSubstr("augmentation '" + bad +
                          "' is not one of none (or empty), crop, flip, crop,flip"));
  }
}

TEST(Augment, CropShiftsThePixelsAndPadsWithZeros) {
  const Tensor image = numbered(2, 5, 6);
  const train::SampleTransform none{};
  EXPECT_EQ(std::memcmp(transformed(none, image).raw(), image.raw(), image.nbytes()), 0);
  for (const auto& [dy, dx] :
       {std::pair{1, -2}, std::pair{-4, 4}, std::pair{4, 0}, std::pair{0, -4}, std::pair{-3, 3}}) {
    SCOPED_TRACE(::testing::Message() << "dy " << dy << ", dx " << dx);
    const Tensor out = transformed({.dy = dy, .dx = dx}, image);
    for (std::int64_t c = 0; c < 2; ++c) {
      for (std::int64_t y = 0; y < 5; ++y) {
        for (std::int64_t x = 0; x < 6; ++x) {
          const std::int64_t sy = y + dy, sx = x + dx;
          const bool inside = sy >= 0 && sy < 5 && sx >= 0 && sx < 6;
          ASSERT_EQ(pixel(out, c, y, x), inside ? pixel(image, c, sy, sx) : 0.0f)
              << c << "," << y << "," << x;
        }
      }
    }
  }
  // A shift by 4 on an image of 4 rows leaves nothing of it: the crop of the padding alone.
  const Tensor small = numbered(1, 4, 4);
  const Tensor gone = transformed({.dy = 4, .dx = 0}, small);
  for (std::int64_t i = 0; i < gone.numel(); ++i) EXPECT_EQ(gone.at(i), 0.0f);
}

TEST(Augment, FlipMirrorsEachRowAfterTheCrop) {
  const Tensor image = numbered(3, 4, 5);
  const Tensor flipped = transformed({.flip = true}, image);
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t y = 0; y < 4; ++y)
      for (std::int64_t x = 0; x < 5; ++x)
        EXPECT_EQ(pixel(flipped, c, y, x), pixel(image, c, y, 4 - x));
  // Crop then flip: the flipped crop, i.e. out(y, x) = in(y + dy, (W-1-x) + dx).
  const Tensor both = transformed({.dy = -1, .dx = 2, .flip = true}, image);
  const Tensor crop = transformed({.dy = -1, .dx = 2}, image);
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t y = 0; y < 4; ++y)
      for (std::int64_t x = 0; x < 5; ++x)
        EXPECT_EQ(pixel(both, c, y, x), pixel(crop, c, y, 4 - x));
}

TEST(Augment, DrawsAreUniformOffsetsAndFairFlipsKeyedBySeedEpochAndSample) {
  const train::Augment both{.crop = true, .flip = true};
  const train::AugmentKey key{.seed = 42, .epoch = 3};
  std::set<std::int64_t> dys, dxs;
  std::int64_t flips = 0, same_as_next_epoch = 0;
  const std::int64_t n = 4000;
  for (std::int64_t i = 0; i < n; ++i) {
    const train::SampleTransform t = train::draw_transform(both, key, i);
    ASSERT_TRUE(t.dy >= -4 && t.dy <= 4 && t.dx >= -4 && t.dx <= 4) << t.dy << " " << t.dx;
    dys.insert(t.dy);
    dxs.insert(t.dx);
    flips += t.flip;
    // A pure function of (seed, epoch, index).
    const train::SampleTransform again = train::draw_transform(both, key, i);
    EXPECT_TRUE(again.dy == t.dy && again.dx == t.dx && again.flip == t.flip);
    const train::SampleTransform next = train::draw_transform(both, {.seed = 42, .epoch = 4}, i);
    same_as_next_epoch += next.dy == t.dy && next.dx == t.dx && next.flip == t.flip;
    // The crop's and the flip's draws are independent of each other.
    EXPECT_EQ(train::draw_transform({.crop = true}, key, i).dx, t.dx);
    EXPECT_FALSE(train::draw_transform({.crop = true}, key, i).flip);
    EXPECT_EQ(train::draw_transform({.flip = true}, key, i).flip, t.flip);
    EXPECT_EQ(train::draw_transform({.flip = true}, key, i).dy, 0);
  }
  EXPECT_EQ(dys.size(), 9u);
  EXPECT_EQ(dxs.size(), 9u);
  EXPECT_NEAR(static_cast<double>(flips) / n, 0.5, 0.04);
  // Another epoch draws anew: 1 in 162 transforms agree by chance.
  EXPECT_LT(same_as_next_epoch, n / 50);
  // Another seed too.
  std::int64_t same_as_other_seed = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const train::SampleTransform a = train::draw_transform(both, key, i);
    const train::SampleTransform b = train::draw_transform(both, {.seed = 43, .epoch = 3}, i);
    same_as_other_seed += a.dy == b.dy && a.dx == b.dx && a.flip == b.flip;
  }
  EXPECT_LT(same_as_other_seed, n / 50);
}

// gather with augmentation writes each sample transformed by its own draw, wherever it sits:
// batches of 12 in one part, in 3 replica parts, or the same samples in batches of 4 give every
// sample the same pixels.
TEST(Augment, GatherGivesASampleTheSameTransformInAnyBatchSplit) {
  const Dataset d = blobs(48, 1);
  auto model = small_mlp();
  model->reset(1);
  const train::CrossEntropy loss;
  optim::Sgd sgd({.lr = 0.1});
  const train::Augment both{.crop = true, .flip = true};
  const train::AugmentKey key{.seed = 7, .epoch = 2};
  const std::vector<std::int64_t> order = permutation(d.size(), 5);
  const std::span<const std::int64_t> batch = std::span(order).subspan(6, 12);
  // The expectation: each sample through its transform.
  std::vector<float> want;
  for (const std::int64_t i : batch) {
    const Tensor image = Tensor::view(d.images.data<float>() + i * 64, {1, 8, 8}, DType::F32);
    const Tensor t = transformed(train::draw_transform(both, key, i), image);
    want.insert(want.end(), t.data<float>(), t.data<float>() + 64);
  }
  for (const int replicas : {1, 3}) {
    train::CompiledStep step = compile(*model, loss, &sgd, 12, replicas);
    train::gather(step, d.images, d.labels, batch, 0, both, key);
    EXPECT_EQ(rows_of(step), want) << replicas << " replicas";
  }
  train::CompiledStep quarter = compile(*model, loss, &sgd, 4);
  std::vector<float> got;
  for (std::size_t b = 0; b < 3; ++b) {
    train::gather(quarter, d.images, d.labels, batch.subspan(4 * b, 4), 0, both, key);
    const std::vector<float> rows = rows_of(quarter);
    got.insert(got.end(), rows.begin(), rows.end());
  }
  EXPECT_EQ(got, want);
  // Micro-steps of accumulation: the same again.
  train::CompiledStep accumulating = compile(*model, loss, &sgd, 12, 1, 3);
  got.clear();
  for (std::size_t j = 0; j < accumulating.micro_steps(); ++j) {
    train::gather(accumulating, d.images, d.labels, batch, j, both, key);
    const std::vector<float> rows = rows_of(accumulating, j);
    got.insert(got.end(), rows.begin(), rows.end());
  }
  EXPECT_EQ(got, want);
  // Labels are not transformed; without augmentation the samples are copied.
  train::CompiledStep plain = compile(*model, loss, &sgd, 12);
  train::gather(plain, d.images, d.labels, batch, 0, {}, key);
  for (std::size_t j = 0; j < 12; ++j) {
    EXPECT_EQ(std::memcmp(plain.parts()[0].x.data<float>() + 64 * j,
                          d.images.data<float>() + 64 * batch[j], 64 * sizeof(float)),
              0);
  }
}

// An autoencoder's targets are its samples: the target is the augmented sample too.
TEST(Augment, TargetsThatAreTheSamplesGetTheSameTransform) {
  const Dataset d = blobs(12, 2);
  nn::Sequential model;
  model.emplace<nn::Flatten>("flatten");
  model.emplace<nn::Linear>("fc", 64, 64, nn::Init::Xavier);
  model.reset(2);
  const train::MeanSquaredError loss;
  optim::AdamW adamw({});
  train::CompiledStep step = compile(model, loss, &adamw, 4);
  const std::vector<std::int64_t> batch{11, 0, 7, 3};
  train::gather(step, d.images, d.images, batch, 0, {.crop = true, .flip = true},
                {.seed = 1, .epoch = 1});
  const train::CompiledStep::Part& part = step.parts()[0];
  EXPECT_EQ(std::memcmp(part.target.raw(), part.x.raw(), part.x.nbytes()), 0);
  EXPECT_NE(std::memcmp(part.x.raw(), d.images.data<float>() + 11 * 64, 64 * sizeof(float)), 0);
}

// The staged batch, which a prefetch thread fills, holds bitwise what gather writes into the
// step, micro-step by micro-step.
TEST(Augment, AStagedBatchFeedsWhatGatherWrites) {
  const Dataset d = blobs(60, 3);
  auto model = small_mlp();
  model->reset(1);
  const train::CrossEntropy loss;
  optim::Sgd sgd({.lr = 0.1});
  const std::vector<std::int64_t> order = permutation(d.size(), 8);
  const std::span<const std::int64_t> batch = std::span(order).subspan(10, 30);
  for (const train::Augment augment :
       {train::Augment{}, train::Augment{.crop = true, .flip = true}}) {
    for (const auto& [replicas, accumulate] : {std::pair{1, 1}, std::pair{2, 3}}) {
      SCOPED_TRACE(::testing::Message() << augment.describe() << ", " << replicas
                                        << " replicas, accumulate " << accumulate);
      train::CompiledStep direct = compile(*model, loss, &sgd, 30, replicas, accumulate);
      train::CompiledStep fed = compile(*model, loss, &sgd, 30, replicas, accumulate);
      train::StagedBatch staged;
      staged.shape_for(fed);
      staged.prepare(d.images, d.labels, batch, augment, {.seed = 3, .epoch = 5});
      for (std::size_t j = 0; j < direct.micro_steps(); ++j) {
        train::gather(direct, d.images, d.labels, batch, j, augment, {.seed = 3, .epoch = 5});
        staged.feed(fed, j);
        EXPECT_EQ(rows_of(direct, j), rows_of(fed, j)) << "micro-step " << j;
        for (std::size_t k = 0; k < direct.parts(j).size(); ++k) {
          const Tensor& a = direct.parts(j)[k].target;
          const Tensor& b = fed.parts(j)[k].target;
          EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
        }
      }
      // Fed to another step than it was shaped for: refused.
      EXPECT_THAT(error_of([&] { staged.feed(direct, 0); }), HasSubstr("another step"));
    }
  }
}

TEST(Augment, SamplesThatAreNotImagesAreRefused) {
  Dataset flat = blobs(8, 4);
  flat.images = flat.images.reshaped({8, 64});
  auto model = small_mlp();
  const train::CrossEntropy loss;
  train::CompiledStep step = train::compile_step(
      *model, loss, nullptr, {.sample = Shape{64}, .batch = 4, .train = false}, {});
  const std::vector<std::int64_t> batch{0, 1, 2, 3};
  EXPECT_THAT(error_of([&] {
                train::gather(step, flat.images, flat.labels, batch, 0, {.crop = true}, {});
              }),
              HasSubstr("augmentation (crop) needs f32 image samples [N, C, H, W], but the "
                        "samples are f32 [8,64]"));
  // Without augmentation they are fine.
  train::gather(step, flat.images, flat.labels, batch);
}
