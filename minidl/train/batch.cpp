#include "minidl/train/batch.hpp"

#include <algorithm>
#include <cstring>

#include "minidl/core/rng.hpp"

namespace minidl::train {

namespace {

// Bytes of one row of t, the `what` [count, ...], checked against one sample of the step's input
// [n, ...].
std::size_t row_bytes(const Tensor& t, std::int64_t count, const char* what, const Tensor& input,
                      std::int64_t n) {
  MINIDL_CHECK(t.shape().rank() >= 1 && t.shape()[0] == count, "gather: the ", what, " ", t.shape(),
               " do not have the samples' ", count, " rows first");
  const std::int64_t per = t.numel() / count;
  MINIDL_CHECK(t.dtype() == input.dtype() && per * n == input.numel(), "gather: the step wants ",
               input.dtype(), " ", input.shape(), " for ", n, " samples (", input.numel() / n,
               " values each), but the ", what, " are ", t.dtype(), " ", t.shape(), " (", per,
               " values each)");
  return static_cast<std::size_t>(per) * dtype_size(t.dtype());
}

// The augmentation's own stream of the counter-based RNG in epoch e: no other draw (parameter
// initialisation hashes names, dropout keys on the step) is made from it.
std::uint64_t augment_stream(std::int64_t epoch) {
  constexpr std::uint64_t kAugment = 0x61756720'63726f70ULL;  // "aug crop"
  return mix64(kAugment + static_cast<std::uint64_t>(epoch));
}

// Uniform in [0, n) from 32 random bits (the multiply-shift map; its bias, below n / 2^32, is
// immaterial for an augmentation).
std::int64_t below(std::uint32_t bits, std::int64_t n) {
  return static_cast<std::int64_t>(
      (static_cast<std::uint64_t>(bits) * static_cast<std::uint64_t>(n)) >> 32);
}

// gather()'s work for one micro-step whose share is `share` and whose inputs are `parts`
// (the step's, or a staged batch's). The indices are checked first; then, with `threads`, the
// samples are copied on the OpenMP threads (each sample's copy and transform is its own: the
// same bytes whoever makes it). The rows come from a data set far larger than the caches, in
// random order: two threads keep twice the reads in flight (the MLP's 64 rows of 3 KiB per step
// took 49 us on one thread). The copies read the rows with no software prefetch: prefetching each
// thread's row four ahead (non-temporal hint) doubled a gather of 32 CIFAR rows in isolation (62
// against 28 us) and made the examples' data time longer (CIFAR CNN 0.029-0.037 against
// 0.020-0.030 s per 10 000-sample epoch, the MLP 0.034-0.042 against 0.033-0.035 s).
void gather_parts(parallel::Slice share, std::span<const CompiledStep::Part> parts,
                  const Tensor& samples, const Tensor& targets, std::span<const std::int64_t> batch,
                  const Augment& augment, const AugmentKey& key, bool threads) {
  MINIDL_CHECK(static_cast<std::int64_t>(batch.size()) >= share.end,
               "gather: this rank takes samples [", share.begin, ", ", share.end,
               ") of the batch, but the batch has ", batch.size(), " indices");
  MINIDL_CHECK(samples.shape().rank() >= 1 && samples.shape()[0] >= 1, "gather: the samples ",
               samples.shape(), " are not [N, ...] with N >= 1");
  check_augmentable(augment, samples, "the samples");
  const std::int64_t count = samples.shape()[0];
  const auto* src = static_cast<const char*>(samples.raw());
  const auto* rows = static_cast<const char*>(targets.raw());
  // An autoencoder's targets are its inputs: they get the same transform.
  const bool targets_are_samples = augment.any() && targets.raw() == samples.raw();
  const Shape image = augment.any()
                          ? Shape(std::vector<std::int64_t>(samples.shape().dims().begin() + 1,
                                                            samples.shape().dims().end()))
                          : Shape{};
  for (const CompiledStep::Part& part : parts) {
    const std::int64_t n = part.end - part.begin;
    const std::size_t x_row = row_bytes(samples, count, "samples", part.x, n);
    const std::size_t t_row = row_bytes(targets, count, "targets", part.target, n);
    const std::int64_t first = share.begin + part.begin;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t i = batch[static_cast<std::size_t>(first + j)];
      MINIDL_CHECK(i >= 0 && i < count, "gather: index ", i, " at position ", first + j,
                   " of the batch is outside the ", count, " samples");
    }
    // Tensors are handles: the part's are the inputs' storage.
    auto* x = static_cast<char*>(part.x.raw());
    auto* t = static_cast<char*>(part.target.raw());
#pragma omp parallel for schedule(static) if (threads && n > 1)
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t i = batch[static_cast<std::size_t>(first + j)];
      if (augment.any()) {
        const SampleTransform tr = draw_transform(augment, key, i);
        apply_transform(tr, reinterpret_cast<const float*>(src + i * x_row),
                        reinterpret_cast<float*>(x + j * x_row), image);
        if (targets_are_samples) {
          apply_transform(tr, reinterpret_cast<const float*>(rows + i * t_row),
                          reinterpret_cast<float*>(t + j * t_row), image);
        } else {
          std::memcpy(t + j * t_row, rows + i * t_row, t_row);
        }
      } else {
        std::memcpy(x + j * x_row, src + i * x_row, x_row);
        std::memcpy(t + j * t_row, rows + i * t_row, t_row);
      }
    }
  }
}

}  // namespace

std::string Augment::describe() const {
  if (crop && flip) return "crop,flip";
  if (crop) return "crop";
  if (flip) return "flip";
  return "none";
}

Augment Augment::parse(std::string_view text) {
  if (text.empty() || text == "none") return {};
  if (text == "crop") return {.crop = true};
  if (text == "flip") return {.flip = true};
  if (text == "crop,flip") return {.crop = true, .flip = true};
  MINIDL_FAIL("augmentation '", text, "' is not one of none (or empty), crop, flip, crop,flip");
}

SampleTransform draw_transform(const Augment& augment, const AugmentKey& key, std::int64_t index) {
  const CounterRng rng(key.seed);
  const std::uint64_t stream = augment_stream(key.epoch);
  const auto i = static_cast<std::uint64_t>(index);
  SampleTransform t;
  if (augment.crop) {
    const std::uint64_t b = rng.bits(stream, 2 * i);
    const std::int64_t span = 2 * augment.pad + 1;
    t.dy = below(static_cast<std::uint32_t>(b), span) - augment.pad;
    t.dx = below(static_cast<std::uint32_t>(b >> 32), span) - augment.pad;
  }
  if (augment.flip) t.flip = (rng.bits(stream, 2 * i + 1) >> 63) != 0;
  return t;
}

void apply_transform(const SampleTransform& t, const float* src, float* dst, const Shape& image) {
  MINIDL_CHECK(image.rank() == 3, "augmentation: an image is [C, H, W], got ", image);
  const std::int64_t c = image[0], h = image[1], w = image[2];
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const float* in = src + ch * h * w;
    float* out = dst + ch * h * w;
    for (std::int64_t y = 0; y < h; ++y) {
      float* row = out + y * w;
      const std::int64_t sy = y + t.dy;
      if (sy < 0 || sy >= h) {
        std::fill(row, row + w, 0.0f);
        continue;
      }
      const float* from = in + sy * w;
      for (std::int64_t x = 0; x < w; ++x) {
        const std::int64_t sx = (t.flip ? w - 1 - x : x) + t.dx;
        row[x] = sx >= 0 && sx < w ? from[sx] : 0.0f;
      }
    }
  }
}

void check_augmentable(const Augment& augment, const Tensor& samples, std::string_view what) {
  if (!augment.any()) return;
  MINIDL_CHECK(augment.pad >= 0, "augmentation: the crop's padding must be 0 or more, got ",
               augment.pad);
  MINIDL_CHECK(samples.shape().rank() == 4 && samples.dtype() == DType::F32, "augmentation (",
               augment.describe(), ") needs f32 image samples [N, C, H, W], but ", what, " are ",
               samples.dtype(), " ", samples.shape());
}

void gather(CompiledStep& step, const Tensor& samples, const Tensor& targets,
            std::span<const std::int64_t> batch, std::size_t micro, const Augment& augment,
            const AugmentKey& key) {
  gather_parts(step.share(micro), step.parts(micro), samples, targets, batch, augment, key,
               /*threads=*/true);
}

void StagedBatch::shape_for(const CompiledStep& step) {
  auto same = [&] {
    if (micro_.size() != step.micro_steps()) return false;
    for (std::size_t j = 0; j < micro_.size(); ++j) {
      const parallel::Slice s = step.share(j);
      const std::span<const CompiledStep::Part> parts = step.parts(j);
      if (micro_[j].share.begin != s.begin || micro_[j].share.end != s.end ||
          micro_[j].parts.size() != parts.size())
        return false;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        const CompiledStep::Part& a = micro_[j].parts[k];
        if (a.begin != parts[k].begin || a.end != parts[k].end ||
            a.x.shape() != parts[k].x.shape() || a.x.dtype() != parts[k].x.dtype() ||
            a.target.shape() != parts[k].target.shape() ||
            a.target.dtype() != parts[k].target.dtype())
          return false;
      }
    }
    return true;
  };
  step_ = &step;
  if (same()) return;
  micro_.clear();
  for (std::size_t j = 0; j < step.micro_steps(); ++j) {
    Micro m{.share = step.share(j), .parts = {}};
    for (const CompiledStep::Part& p : step.parts(j)) {
      m.parts.push_back({.begin = p.begin,
                         .end = p.end,
                         .x = Tensor::empty(p.x.shape(), p.x.dtype()),
                         .target = Tensor::empty(p.target.shape(), p.target.dtype())});
    }
    micro_.push_back(std::move(m));
  }
}

void StagedBatch::prepare(const Tensor& samples, const Tensor& targets,
                          std::span<const std::int64_t> batch, const Augment& augment,
                          const AugmentKey& key) {
  MINIDL_CHECK(step_ != nullptr, "StagedBatch::prepare before shape_for");
  for (const Micro& m : micro_)
    gather_parts(m.share, m.parts, samples, targets, batch, augment, key, /*threads=*/false);
}

void StagedBatch::feed(CompiledStep& step, std::size_t micro) const {
  MINIDL_CHECK(&step == step_ && micro < micro_.size(), "StagedBatch::feed: micro-step ", micro,
               " of another step than the batch was shaped for");
  std::span<CompiledStep::Part> into = step.parts(micro);
  const std::vector<CompiledStep::Part>& from = micro_[micro].parts;
  for (std::size_t k = 0; k < from.size(); ++k) {
    std::memcpy(into[k].x.raw(), from[k].x.raw(), from[k].x.nbytes());
    std::memcpy(into[k].target.raw(), from[k].target.raw(), from[k].target.nbytes());
  }
}

}  // namespace minidl::train
