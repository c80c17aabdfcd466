// Feeding a compiled step from samples held in memory: what a hand-written training loop does
// before each CompiledStep::run().
#pragma once

#include <cstdint>
#include <span>

#include "minidl/core/tensor.hpp"
#include "minidl/train/step.hpp"

namespace minidl::train {

/// Writes this rank's samples of micro-step `micro` of one batch into step's inputs (a step
/// without accumulation has the one micro-step 0). batch holds the global batch's sample
/// indices into samples [N, ...] and targets [N, ...]; for each position i of this rank's share
/// (CompiledStep::share(micro)) sample batch[i] goes into its part's x and row batch[i] of
/// targets into its target: class labels i32 [N] for cross-entropy, or f32 rows of the
/// output's size for MSE and BCE (an autoencoder passes the samples themselves). Throws
/// minidl::Error naming the tensor and shapes when they do not fit the step, or an index that
/// is out of range.
void gather(CompiledStep& step, const Tensor& samples, const Tensor& targets,
            std::span<const std::int64_t> batch, std::size_t micro = 0);

}  // namespace minidl::train
