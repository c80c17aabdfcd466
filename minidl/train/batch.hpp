// Feeding a compiled step from samples held in memory: what a hand-written training loop does
// before each CompiledStep::run(), with optional data augmentation of image samples, directly
// into the step's inputs or into a staged batch of its own that a prefetch thread can fill while
// another step runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "minidl/core/tensor.hpp"
#include "minidl/train/step.hpp"

namespace minidl::train {

/// Random transforms of training images [C, H, W], drawn for each sample. Off by default.
struct Augment {
  /// A random H x W crop of the image zero-padded by `pad` on each side: a shift by dy, dx
  /// uniform in [-pad, pad], what is shifted in being 0 (the padding value of normalised data).
  bool crop = false;
  /// A horizontal flip with probability 1/2 (after the crop).
  bool flip = false;
  std::int64_t pad = 4;

  bool any() const { return crop || flip; }
  /// "none", "crop", "flip" or "crop,flip".
  std::string describe() const;
  /// The inverse of describe(); "" means "none". Throws minidl::Error listing the accepted
  /// values.
  static Augment parse(std::string_view text);
};

/// What the draws of an augmentation depend on besides the sample's index in the dataset: the
/// run's seed and the epoch. A sample's transform is a pure function of (seed, epoch, index), a
/// stream of the counter-based RNG of its own, so it is the same whichever rank, thread,
/// micro-step or batch split handles the sample, and a resumed run draws it again.
struct AugmentKey {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
};

/// One sample's transform: out(c, y, x) = in(c, y + dy, x' + dx), x' = W-1-x when flipped, else
/// x; 0 where that falls outside the image.
struct SampleTransform {
  std::int64_t dy = 0, dx = 0;
  bool flip = false;
};

/// The transform of sample `index` (its index in the dataset) under augment and key. The crop's
/// and the flip's draws are independent: --augment flip flips the samples crop,flip flips.
SampleTransform draw_transform(const Augment& augment, const AugmentKey& key, std::int64_t index);

/// Writes image src [C, H, W] transformed by t into dst [C, H, W] (not overlapping src).
void apply_transform(const SampleTransform& t, const float* src, float* dst, const Shape& image);

/// Writes this rank's samples of micro-step `micro` of one batch into step's inputs (a step
/// without accumulation has the one micro-step 0). batch holds the global batch's sample
/// indices into samples [N, ...] and targets [N, ...]; for each position i of this rank's share
/// (CompiledStep::share(micro)) sample batch[i] goes into its part's x and row batch[i] of
/// targets into its target: class labels i32 [N] for cross-entropy, or f32 rows of the
/// output's size for MSE and BCE (an autoencoder passes the samples themselves). Throws
/// minidl::Error naming the tensor and shapes when they do not fit the step, or an index that
/// is out of range.
///
/// With augment.any(), every sample is transformed by draw_transform(augment, key, batch[i]);
/// the samples must be images [N, C, H, W] (f32). When targets are the samples themselves (the
/// same storage), each target row gets its sample's transform too.
void gather(CompiledStep& step, const Tensor& samples, const Tensor& targets,
            std::span<const std::int64_t> batch, std::size_t micro = 0, const Augment& augment = {},
            const AugmentKey& key = {});

/// Checks that samples [N, ...] can be augmented: f32 images [N, C, H, W]. Throws minidl::Error
/// naming `what` (the data set) and the shape otherwise; does nothing when !augment.any().
void check_augmentable(const Augment& augment, const Tensor& samples, std::string_view what);

/// A batch prepared ahead of its step: this rank's samples of every micro-step of one step, in
/// buffers of its own shaped like the step's inputs. prepare() reads only the batch's own
/// buffers and the samples, so a thread may run it while the step (or another) runs; feed()
/// then copies one micro-step into the step's inputs. The result is bitwise what gather()
/// writes.
class StagedBatch {
 public:
  /// Buffers for step's micro-steps (reused when the last layout was step's).
  void shape_for(const CompiledStep& step);
  /// gather() of every micro-step into the buffers.
  void prepare(const Tensor& samples, const Tensor& targets, std::span<const std::int64_t> batch,
               const Augment& augment = {}, const AugmentKey& key = {});
  /// Copies micro-step `micro` into step's inputs: step must be the one shape_for() was given.
  void feed(CompiledStep& step, std::size_t micro) const;

 private:
  struct Micro {
    parallel::Slice share;
    std::vector<CompiledStep::Part> parts;
  };
  const CompiledStep* step_ = nullptr;
  std::vector<Micro> micro_;
};

}  // namespace minidl::train
