// Inference: a model's forward alone, compiled and run once on samples held in memory. No loss,
// no targets, no gradients: what a program that only loads parameters and classifies (or
// reconstructs) needs.
#pragma once

#include <cstdint>
#include <vector>

#include "minidl/core/tensor.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/model.hpp"

namespace minidl::train {

/// The model's output for f32 samples [N, ...] (N >= 1; one sample's shape as the model takes
/// it, e.g. [N, 1, 28, 28]), in evaluation mode (dropout adds nothing): logits [N, classes] for
/// a classifier, a reconstruction for an autoencoder. Compiles a graph of the forward for N
/// samples with the passes of an evaluation program, runs it once and returns a copy of the
/// output, so call it with a whole set (or large slices of one), not once per sample. Leaves the
/// model in evaluation mode.
Tensor predict(Model& model, const Tensor& samples, const runtime::CompileOptions& options = {});

/// The class of each row of scores [N, classes] (logits or probabilities): the index of the
/// largest value, the first on ties.
std::vector<std::int64_t> predicted_classes(const Tensor& scores);

}  // namespace minidl::train
