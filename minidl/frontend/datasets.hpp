// Labelled image sets read from their official files: MNIST and Fashion-MNIST IDX, raw or gzip.
#pragma once

#include <cstdint>
#include <string>

#include "minidl/core/tensor.hpp"

namespace minidl {

/// A labelled image set held in memory: images f32 [N, C, H, W] scaled to [0,1] (or normalised),
/// labels i32 [N].
struct Dataset {
  std::string name;  // e.g. "mnist/train"
  Tensor images;     // f32 [N, C, H, W]
  Tensor labels;     // i32 [N]
  int num_classes = 10;
  /// Number of samples N (0 for an empty Dataset).
  std::int64_t size() const;
};

/// Reads an IDX image file (magic 0x00000803, u8, dims N,H,W) and label file (0x00000801); raw
/// or gzip (detected by the gzip magic bytes, not the name). Pixels become f32 v/255 in
/// [N, 1, H, W]. Throws minidl::Error naming the file and byte offset of anything malformed.
Dataset read_idx(const std::string& images_path, const std::string& labels_path, std::string name,
                 int num_classes = 10);

/// MNIST / Fashion-MNIST from a directory holding train-images-idx3-ubyte[.gz],
/// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz];
/// split is "train" or "test". Takes the raw file if present, else the .gz.
Dataset load_mnist(const std::string& dir, const std::string& split,
                   const std::string& dataset = "mnist");

/// Keeps the first n samples (n <= 0 or n >= size keeps all); the result owns its data.
Dataset take(const Dataset& d, std::int64_t n);

}  // namespace minidl
