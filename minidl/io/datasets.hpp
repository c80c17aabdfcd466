// Labelled image sets read from their official files: MNIST and Fashion-MNIST IDX and CIFAR-10
// binary batches, each raw or gzip; per-channel normalisation; loading by dataset name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

/// A dataset's training and test sets.
struct DatasetSplits {
  Dataset train;
  Dataset test;
};

/// Records in each official CIFAR-10 batch file.
inline constexpr std::int64_t kCifar10RecordsPerFile = 10000;

/// Reads CIFAR-10 binary batch files, each raw or gzip (detected by content), into one set in
/// file order. A record is 1 label byte (0..9) and 3072 pixel bytes: the R, G and B planes of a
/// 32x32 image, row-major. Pixels become f32 v/255 in [N, 3, 32, 32]. Each file must hold
/// exactly records_per_file records (0: any positive number). Throws minidl::Error naming the
/// file and the byte offset of a wrong size or of a label out of range.
Dataset read_cifar10(const std::vector<std::string>& paths, std::string name,
                     std::int64_t records_per_file = kCifar10RecordsPerFile);

/// CIFAR-10 from a directory holding data_batch_1.bin .. data_batch_5.bin (train, in that order)
/// and test_batch.bin (test), each raw or as .gz; takes the raw file if present, else the .gz.
/// Pixels are in [0,1]; see channel_stats and normalize_channels to standardise them.
DatasetSplits load_cifar10(const std::string& dir,
                           std::int64_t records_per_file = kCifar10RecordsPerFile);

/// Per-channel mean and standard deviation of a set's images.
struct ChannelStats {
  std::vector<double> mean;
  std::vector<double> stddev;
};

/// The mean and population standard deviation of each channel c of d's images [N, C, ...], over
/// all samples and positions, computed in double in a fixed order (the same for any thread
/// count). Compute them on the training set and apply them to every split.
ChannelStats channel_stats(const Dataset& d);

/// Standardises d's images in place per channel: x = (x - mean[c]) / stddev[c], so that a set
/// with these statistics gets zero mean and unit variance in every channel. A channel with
/// stddev 0 (constant) is only centred.
void normalize_channels(Dataset& d, const ChannelStats& stats);

/// The datasets load_dataset knows, in a fixed order: mnist, fashion-mnist, cifar10.
std::vector<std::string> dataset_names();

/// Loads dataset `name` (one of dataset_names()) from dir: load_mnist's train and test sets for
/// mnist and fashion-mnist, load_cifar10 for cifar10. An unknown name fails listing the known.
DatasetSplits load_dataset(const std::string& name, const std::string& dir);

/// Keeps the first n samples (n <= 0 or n >= size keeps all); the result owns its data.
Dataset take(const Dataset& d, std::int64_t n);

/// d with every image enlarged k times per side by pixel replication (nearest neighbour): more
/// work per sample at the same information, as report 003 grew MNIST to 3136 and 12544 pixels to
/// study granularity. k = 1 returns d unchanged.
Dataset upscale(const Dataset& d, std::int64_t k);

}  // namespace minidl
