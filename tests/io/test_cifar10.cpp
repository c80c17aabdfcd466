// CIFAR-10 binary batches: small files raw and gzipped, load_cifar10's file choice and order,
// files of the wrong size and bad labels (the message names the file and byte offset), the
// per-channel normalisation, and loading by dataset name.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/io/datasets.hpp"
#include "support/error_of.hpp"
#include "support/gzip.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Bytes = std::vector<std::uint8_t>;

constexpr std::int64_t kRecord = 3073;
constexpr std::int64_t kPerFile = 3;  // records per file in these tests

/// The pixel byte of record r (counted over all files), channel c, row y, column x.
std::uint8_t pixel(std::int64_t r, std::int64_t c, std::int64_t y, std::int64_t x) {
  return static_cast<std::uint8_t>((r * 131 + c * 71 + y * 7 + x * 3) % 256);
}

/// A batch file of n records with labels label(r) and pixels pixel(first + r, ...).
Bytes batch(std::int64_t first, std::int64_t n, const std::vector<std::uint8_t>& labels) {
  Bytes b;
  for (std::int64_t r = 0; r < n; ++r) {
    b.push_back(labels[static_cast<std::size_t>(r)]);
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t y = 0; y < 32; ++y)
        for (std::int64_t x = 0; x < 32; ++x) b.push_back(pixel(first + r, c, y, x));
  }
  return b;
}

Bytes gzip(const Bytes& raw) { return minidl::testing::gzip(raw, 6); }

using minidl::testing::error_of;

class Cifar10Test : public minidl::testing::TempDirTest {
 protected:
  /// data_batch_1..5.bin and test_batch.bin of kPerFile records each; file i holds records
  /// i * kPerFile.. with labels (record % 10). gz_from: files from this one on are gzipped.
  void write_all(int gz_from = 7) {
    for (int i = 0; i < 6; ++i) {
      std::vector<std::uint8_t> labels;
      for (std::int64_t r = 0; r < kPerFile; ++r)
        labels.push_back(static_cast<std::uint8_t>((i * kPerFile + r) % 10));
      const Bytes b = batch(i * kPerFile, kPerFile, labels);
      const std::string name =
          i < 5 ? fmt::format("data_batch_{}.bin", i + 1) : std::string("test_batch.bin");
      if (i + 1 >= gz_from)
        file(name + ".gz", gzip(b));
      else
        file(name, b);
    }
  }
};

void expect_pixels(const Dataset& d, std::int64_t first_record) {
  ASSERT_EQ(d.images.shape()[1], 3);
  for (std::int64_t r = 0; r < d.size(); ++r)
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t y = 0; y < 32; y += 5)
        for (std::int64_t x = 0; x < 32; x += 3) {
          const std::int64_t i = ((r * 3 + c) * 32 + y) * 32 + x;
          ASSERT_EQ(d.images.at(i), static_cast<float>(pixel(first_record + r, c, y, x)) / 255.0f)
              << "record " << r << " channel " << c << " y " << y << " x " << x;
        }
}

TEST_F(Cifar10Test, ReadsRecordsAsRGBPlanes) {
  const Bytes b = batch(0, 4, {3, 0, 9, 6});
  const Dataset d = read_cifar10({file("b.bin", b)}, "toy", 4);
  EXPECT_EQ(d.name, "toy");
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_EQ(d.images.shape(), (Shape{4, 3, 32, 32}));
  EXPECT_EQ(d.images.dtype(), DType::F32);
  EXPECT_EQ(d.labels.shape(), (Shape{4}));
  EXPECT_EQ(d.labels.dtype(), DType::I32);
  EXPECT_EQ(
      std::vector<std::int32_t>(d.labels.data<std::int32_t>(), d.labels.data<std::int32_t>() + 4),
      (std::vector<std::int32_t>{3, 0, 9, 6}));
  expect_pixels(d, 0);
  // Byte 1 of the file is record 0's red pixel (0, 0); byte 1 + 1024 its green one.
  EXPECT_EQ(d.images.at(0), b[1] / 255.0f);
  EXPECT_EQ(d.images.at(1024), b[1 + 1024] / 255.0f);
  // Any record count when records_per_file is 0; gzip is detected by content.
  const Dataset any = read_cifar10({file("c.gz", gzip(b)), file("d.bin", b)}, "two", 0);
  EXPECT_EQ(any.size(), 8);
  EXPECT_EQ(any.labels.data<std::int32_t>()[6], 9);
  EXPECT_EQ(any.images.at(4 * 3072 + 5), d.images.at(5));
}

TEST_F(Cifar10Test, LoadTakesFiveTrainingBatchesInOrderAndTheTestBatch) {
  write_all(/*gz_from=*/4);  // batches 4, 5 and the test batch gzipped
  file("data_batch_1.bin.gz", gzip(batch(100, kPerFile, {1, 1, 1})));  // raw is preferred
  const DatasetSplits s = load_cifar10(dir_.string(), kPerFile);
  EXPECT_EQ(s.train.name, "cifar10/train");
  EXPECT_EQ(s.test.name, "cifar10/test");
  ASSERT_EQ(s.train.size(), 5 * kPerFile);
  ASSERT_EQ(s.test.size(), kPerFile);
  for (std::int64_t r = 0; r < 5 * kPerFile; ++r)
    EXPECT_EQ(s.train.labels.data<std::int32_t>()[r], r % 10) << r;
  for (std::int64_t r = 0; r < kPerFile; ++r)
    EXPECT_EQ(s.test.labels.data<std::int32_t>()[r], (5 * kPerFile + r) % 10) << r;
  expect_pixels(s.train, 0);
  expect_pixels(s.test, 5 * kPerFile);
}

TEST_F(Cifar10Test, LoadByNameAndMissingFiles) {
  EXPECT_EQ(dataset_names(), (std::vector<std::string>{"mnist", "fashion-mnist", "cifar10"}));
  EXPECT_THAT(error_of([&] { load_dataset("cifar100", dir_.string()); }),
              HasSubstr("unknown dataset 'cifar100' (known: mnist, fashion-mnist, cifar10)"));

  const std::string missing = (dir_ / "nowhere").string();
  std::string msg = error_of([&] { load_dataset("cifar10", missing); });
  EXPECT_THAT(msg, HasSubstr("data directory '" + missing + "' does not exist"));
  EXPECT_THAT(msg, HasSubstr("run scripts/fetch-data cifar10"));

  write_all();
  fs::remove(dir_ / "data_batch_3.bin");
  msg = error_of([&] { load_cifar10(dir_.string(), kPerFile); });
  EXPECT_THAT(msg, HasSubstr("has neither 'data_batch_3.bin' nor 'data_batch_3.bin.gz'"));
  EXPECT_THAT(msg, HasSubstr("run scripts/fetch-data cifar10"));
  // The official record count: these small files are refused, naming the size expected.
  write_all();
  msg = error_of([&] { load_dataset("cifar10", dir_.string()); });
  EXPECT_THAT(msg, HasSubstr("data_batch_1.bin'"));
  EXPECT_THAT(msg, HasSubstr("found 9219 bytes, expected 30730000 bytes (10000 3073-byte "
                             "records: 1 label byte and 3072 pixel bytes)"));
}

TEST_F(Cifar10Test, WrongSizesNameTheFileAndOffset) {
  const Bytes good = batch(0, kPerFile, {1, 2, 3});
  struct Case {
    std::string what;
    Bytes bytes;
    std::int64_t per_file;
    std::vector<std::string> words;
  };
  Bytes cut_inside(good.begin(), good.end() - 100);
  Bytes cut_between(good.begin(), good.begin() + 2 * kRecord);
  Bytes longer = good;
  longer.insert(longer.end(), {7, 7});
  const std::vector<Case> cases = {
      {"cut inside the last record",
       cut_inside,
       kPerFile,
       {"truncated CIFAR-10 batch file", "found 9119 bytes, expected 9219 bytes",
        "ends at byte offset 9119, inside record 2 (which starts at offset 6146)"}},
      {"cut between records",
       cut_between,
       kPerFile,
       {"truncated CIFAR-10 batch file", "found 6146 bytes, expected 9219",
        "ends at byte offset 6146, after record 1"}},
      {"empty", {}, kPerFile, {"found 0 bytes", "the file is empty"}},
      {"trailing bytes",
       longer,
       kPerFile,
       {"trailing bytes in CIFAR-10 batch file", "2 unexpected bytes at offset 9219",
        "expected 9219 bytes", "found 9221"}},
      {"any count, cut",
       cut_inside,
       0,
       {"truncated CIFAR-10 batch file", "ends at byte offset 9119, inside record 2",
        "expected a whole number of 3073-byte records"}},
      {"any count, empty", {}, 0, {"empty CIFAR-10 batch file", "expected one or more"}},
      {"gzip, cut",
       gzip(cut_inside),
       kPerFile,
       {"(gzip; offsets count decompressed bytes)", "found 9119 bytes"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = file(fmt::format("case{}.bin", i++), c.bytes);
    const std::string msg = error_of([&] { read_cifar10({path}, "bad", c.per_file); });
    EXPECT_THAT(msg, HasSubstr("'" + path + "'"));
    for (const std::string& w : c.words) EXPECT_THAT(msg, HasSubstr(w));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST_F(Cifar10Test, LabelAboveNineNamesTheRecordAndOffset) {
  const std::string ok = file("ok.bin", batch(0, kPerFile, {1, 2, 3}));
  const std::string bad = file("bad.bin", batch(0, kPerFile, {4, 10, 255}));
  const std::string msg = error_of([&] { read_cifar10({ok, bad}, "bad", kPerFile); });
  EXPECT_THAT(msg, HasSubstr("label out of range in CIFAR-10 batch file '" + bad + "'"));
  EXPECT_THAT(msg, HasSubstr("record 1 at byte offset 3073 has label 10, expected 0..9"));
}

TEST(ChannelNormalisation, TrainingStatisticsGiveZeroMeanUnitVariance) {
  // Channel c of sample i at position j: a different offset and spread per channel.
  auto make = [](std::int64_t n, double shift) {
    Dataset d;
    d.name = "toy";
    d.images = Tensor::empty({n, 3, 4, 5});
    d.labels = Tensor::zeros({n}, DType::I32);
    for (std::int64_t i = 0; i < d.images.numel(); ++i) {
      const std::int64_t c = (i / 20) % 3;
      d.images.data<float>()[i] =
          static_cast<float>(0.1 * c + shift + (0.05 + 0.1 * c) * std::sin(0.37 * i));
    }
    return d;
  };
  Dataset train = make(50, 0.0), test = make(20, 0.25);
  const ChannelStats st = channel_stats(train);
  ASSERT_EQ(st.mean.size(), 3u);
  ASSERT_EQ(st.stddev.size(), 3u);
  // Against a direct computation in double.
  for (int c = 0; c < 3; ++c) {
    double s = 0, ss = 0;
    std::int64_t m = 0;
    for (std::int64_t i = 0; i < train.images.numel(); ++i) {
      if ((i / 20) % 3 != c) continue;
      s += train.images.at(i);
      ++m;
    }
    const double mean = s / m;
    for (std::int64_t i = 0; i < train.images.numel(); ++i)
      if ((i / 20) % 3 == c) ss += (train.images.at(i) - mean) * (train.images.at(i) - mean);
    EXPECT_NEAR(st.mean[c], mean, 1e-12);
    EXPECT_NEAR(st.stddev[c], std::sqrt(ss / m), 1e-12);
    EXPECT_GT(st.stddev[c], 0.01);
  }
  const Tensor test_before = test.images.clone();
  normalize_channels(train, st);
  normalize_channels(test, st);
  const ChannelStats after = channel_stats(train);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(after.mean[c], 0.0, 1e-6);
    EXPECT_NEAR(after.stddev[c], 1.0, 1e-5);
  }
  // The test set gets the training set's transform, not its own (its mean is shifted), and each
  // pixel is the float nearest (x - mean) / sd: rounded once, as a reference computing in
  // double and storing float32 has it (an error repeated on every pixel of a level does not
  // average out in a batch mean).
  for (std::int64_t i = 0; i < test.images.numel(); ++i) {
    const std::int64_t c = (i / 20) % 3;
    const double exact = (static_cast<double>(test_before.at(i)) - st.mean[c]) / st.stddev[c];
    EXPECT_EQ(test.images.at(i), static_cast<float>(exact)) << i;
  }
  EXPECT_GT(channel_stats(test).mean[0], 1.0);

  // The same statistics for any thread count.
  const int saved = max_threads();
  set_num_threads(1);
  const ChannelStats one = channel_stats(make(50, 0.0));
  set_num_threads(3);
  const ChannelStats three = channel_stats(make(50, 0.0));
  set_num_threads(saved);
  EXPECT_EQ(one.mean, three.mean);
  EXPECT_EQ(one.stddev, three.stddev);

  // A constant channel is centred only; a channel count mismatch is refused.
  Dataset flat = make(2, 0.0);
  for (std::int64_t i = 0; i < flat.images.numel(); ++i) flat.images.data<float>()[i] = 0.5f;
  const ChannelStats fs = channel_stats(flat);
  normalize_channels(flat, fs);
  EXPECT_EQ(flat.images.at(7), 0.0f);
  ChannelStats two{{0.0, 0.0}, {1.0, 1.0}};
  EXPECT_THAT(error_of([&] { normalize_channels(flat, two); }),
              HasSubstr("do not have the 2 channels of the statistics"));
}

/// The real CIFAR-10 files, when they sit beside MINIDL_DATA_DIR's mnist folder (data/cifar10)
/// or MINIDL_DATA_DIR points at them.
TEST(RealCifar10, HasTheKnownCountsAndFirstLabels) {
  const char* env = std::getenv("MINIDL_DATA_DIR");
  if (env == nullptr || *env == '\0') {
    GTEST_SKIP() << "MINIDL_DATA_DIR is not set; run scripts/fetch-data cifar10 and set "
                    "MINIDL_DATA_DIR=data to check the real CIFAR-10 files";
  }
  fs::path root = fs::path(env).lexically_normal();
  if (!root.has_filename()) root = root.parent_path();
  fs::path dir = root;
  for (const fs::path& p : {root, root / "cifar10", root.parent_path() / "cifar10"}) {
    if (fs::exists(p / "test_batch.bin") || fs::exists(p / "test_batch.bin.gz")) dir = p;
  }
  if (!fs::exists(dir / "test_batch.bin") && !fs::exists(dir / "test_batch.bin.gz")) {
    GTEST_SKIP() << "no CIFAR-10 files near MINIDL_DATA_DIR='" << env
                 << "'; run scripts/fetch-data cifar10";
  }
  const DatasetSplits s = load_cifar10(dir.string());
  EXPECT_EQ(s.train.size(), 50000);
  EXPECT_EQ(s.test.size(), 10000);
  EXPECT_EQ(s.train.images.shape(), (Shape{50000, 3, 32, 32}));
  // Official order: the first training image is a frog (6), the first test image a cat (3).
  EXPECT_EQ(s.train.labels.data<std::int32_t>()[0], 6);
  EXPECT_EQ(s.test.labels.data<std::int32_t>()[0], 3);
  std::vector<std::int64_t> counts(10, 0);
  for (std::int64_t i = 0; i < s.test.size(); ++i) ++counts[s.test.labels.data<std::int32_t>()[i]];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c], 1000) << "class " << c;
}

}  // namespace
}  // namespace minidl
