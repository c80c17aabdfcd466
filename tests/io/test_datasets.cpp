// IDX reading: good files raw and gzipped, load_mnist's file choice, and a table of corrupt files
// each of which must fail with a message naming the file and what was wrong.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/io/datasets.hpp"
#include "support/error_of.hpp"
#include "support/gzip.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Bytes = std::vector<std::uint8_t>;

constexpr std::uint32_t kImageMagic = 0x00000803;
constexpr std::uint32_t kLabelMagic = 0x00000801;
constexpr int kN = 5, kH = 3, kW = 4;

void put_be32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(v >> s));
}

Bytes idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes b;
  put_be32(b, magic);
  for (auto d : dims) put_be32(b, d);
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes pixels() {
  Bytes p(static_cast<std::size_t>(kN * kH * kW));
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(i * 37 + 11);
  p.front() = 0;  // both ends of the range
  p.back() = 255;
  return p;
}
const Bytes kLabels = {5, 0, 4, 1, 9};

Bytes good_images() { return idx_bytes(kImageMagic, {kN, kH, kW}, pixels()); }
Bytes good_labels() { return idx_bytes(kLabelMagic, {kN}, kLabels); }

Bytes gzip(const Bytes& raw) { return minidl::testing::gzip(raw, 9); }

Bytes cut(Bytes b, std::size_t n) {
  b.resize(n);
  return b;
}

Bytes concat_bytes(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void write_file(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  ASSERT_TRUE(f.good()) << p;
}

using minidl::testing::error_of;

class DatasetsTest : public minidl::testing::TempDirTest {};

void expect_same(const Dataset& a, const Dataset& b) {
  ASSERT_EQ(a.images.shape(), b.images.shape());
  ASSERT_EQ(a.labels.shape(), b.labels.shape());
  EXPECT_EQ(std::memcmp(a.images.raw(), b.images.raw(), a.images.nbytes()), 0);
  EXPECT_EQ(std::memcmp(a.labels.raw(), b.labels.raw(), a.labels.nbytes()), 0);
}

TEST_F(DatasetsTest, ReadsRawIdxFiles) {
  Dataset d = read_idx(file("img", good_images()), file("lab", good_labels()), "toy/train");
  EXPECT_EQ(d.name, "toy/train");
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_EQ(d.size(), kN);
  EXPECT_EQ(d.images.shape(), (Shape{kN, 1, kH, kW}));
  EXPECT_EQ(d.images.dtype(), DType::F32);
  EXPECT_EQ(d.labels.shape(), (Shape{kN}));
  EXPECT_EQ(d.labels.dtype(), DType::I32);
  const Bytes p = pixels();
  for (std::size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(d.images.at(static_cast<std::int64_t>(i)), static_cast<float>(p[i]) / 255.0f) << i;
  }
  EXPECT_EQ(d.images.at(0), 0.0f);
  EXPECT_EQ(d.images.at(kN * kH * kW - 1), 1.0f);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(d.labels.data<std::int32_t>()[i], kLabels[i]);
}

TEST_F(DatasetsTest, GzipIsDetectedByContentAndEqualsRaw) {
  Dataset raw = read_idx(file("img", good_images()), file("lab", good_labels()), "raw");
  // Names that lie: a gzipped file without .gz and a raw file with it.
  Dataset gz = read_idx(file("img.idx", gzip(good_images())), file("lab.gz", good_labels()), "gz");
  expect_same(raw, gz);
  Dataset both =
      read_idx(file("img.gz", gzip(good_images())), file("lab2.gz", gzip(good_labels())), "both");
  expect_same(raw, both);
}

TEST_F(DatasetsTest, ReadsConcatenatedGzipMembers) {
  const Bytes img = good_images();
  const Bytes a(img.begin(), img.begin() + 30);
  const Bytes b(img.begin() + 30, img.end());
  Dataset raw = read_idx(file("img", img), file("lab", good_labels()), "raw");
  Dataset gz =
      read_idx(file("img.gz", concat_bytes(gzip(a), gzip(b))), file("lab", good_labels()), "gz");
  expect_same(raw, gz);
}

TEST_F(DatasetsTest, NumClassesBoundsLabels) {
  Dataset d = read_idx(file("img", good_images()), file("lab", good_labels()), "toy", 10);
  EXPECT_EQ(d.num_classes, 10);
  EXPECT_THAT(error_of([&] { read_idx(dir_ / "img", dir_ / "lab", "toy", 9); }),
              HasSubstr("sample 4 at byte offset 12 has label 9, expected 0..8 (num_classes 9)"));
  EXPECT_THAT(error_of([&] { read_idx(dir_ / "img", dir_ / "lab", "toy", 0); }),
              HasSubstr("num_classes must be at least 1, got 0"));
}

TEST_F(DatasetsTest, LoadMnistPrefersRawThenGz) {
  // train: both raw and .gz exist and differ, so the raw one must be taken; test: only .gz.
  const Bytes other_labels = idx_bytes(kLabelMagic, {kN}, {1, 1, 1, 1, 1});
  file("train-images-idx3-ubyte", good_images());
  file("train-labels-idx1-ubyte", good_labels());
  file("train-images-idx3-ubyte.gz", gzip(good_images()));
  file("train-labels-idx1-ubyte.gz", gzip(other_labels));
  file("t10k-images-idx3-ubyte.gz", gzip(good_images()));
  file("t10k-labels-idx1-ubyte.gz", gzip(other_labels));

  Dataset train = load_mnist(dir_.string(), "train");
  EXPECT_EQ(train.name, "mnist/train");
  EXPECT_EQ(train.labels.data<std::int32_t>()[0], 5);
  Dataset test = load_mnist(dir_.string(), "test", "fashion-mnist");
  EXPECT_EQ(test.name, "fashion-mnist/test");
  EXPECT_EQ(test.size(), kN);
  EXPECT_EQ(test.labels.data<std::int32_t>()[0], 1);
}

TEST_F(DatasetsTest, LoadMnistErrors) {
  const std::string missing = (dir_ / "nowhere").string();
  std::string msg = error_of([&] { load_mnist(missing, "train"); });
  EXPECT_THAT(msg, HasSubstr("data directory '" + missing + "' does not exist"));
  EXPECT_THAT(msg, HasSubstr("run scripts/fetch-data mnist"));
  EXPECT_THAT(error_of([&] { load_mnist(missing, "train", "fashion-mnist"); }),
              HasSubstr("run scripts/fetch-data fashion-mnist"));

  const std::string plain = file("plain", good_labels());
  EXPECT_THAT(error_of([&] { load_mnist(plain, "train"); }),
              HasSubstr("data directory '" + plain + "' is not a directory"));

  EXPECT_THAT(error_of([&] { load_mnist(dir_.string(), "val"); }),
              HasSubstr("unknown mnist split 'val', expected 'train' or 'test'"));

  file("train-images-idx3-ubyte", good_images());
  msg = error_of([&] { load_mnist(dir_.string(), "train"); });
  EXPECT_THAT(msg, HasSubstr("has neither 'train-labels-idx1-ubyte' nor "
                             "'train-labels-idx1-ubyte.gz'"));
  EXPECT_THAT(msg, HasSubstr(dir_.string()));
}

TEST_F(DatasetsTest, TakeKeepsTheFirstSamples) {
  Dataset d = read_idx(file("img", good_images()), file("lab", good_labels()), "toy");
  Dataset t = take(d, 2);
  EXPECT_EQ(t.size(), 2);
  EXPECT_EQ(t.images.shape(), (Shape{2, 1, kH, kW}));
  EXPECT_EQ(t.name, d.name);
  EXPECT_EQ(std::memcmp(t.images.raw(), d.images.raw(), t.images.nbytes()), 0);
  EXPECT_EQ(t.labels.data<std::int32_t>()[1], 0);
  EXPECT_EQ(take(d, 0).size(), kN);
  EXPECT_EQ(take(d, -3).size(), kN);
  EXPECT_EQ(take(d, 100).size(), kN);
  EXPECT_EQ(Dataset{}.size(), 0);
}

/// One corrupt case: the contents of the image and label files (nullopt: no file; an empty
/// optional directory flag makes the path a directory) and the words its error must contain.
struct Corrupt {
  std::string what;
  std::optional<Bytes> images = good_images();
  std::optional<Bytes> labels = good_labels();
  bool bad_is_labels = false;  // whose path the message must name
  std::vector<std::string> words;
  bool images_is_dir = false;
};

std::vector<Corrupt> corrupt_cases() {
  std::vector<Corrupt> cases;
  const Bytes img = good_images();  // 16-byte header + 60 pixels = 76 bytes
  const Bytes lab = good_labels();  // 8-byte header + 5 labels = 13 bytes
  for (std::size_t at : {0, 2, 3}) {
    cases.push_back(
        {.what = fmt::format("images cut at {}", at),
         .images = cut(img, at),
         .words = {"truncated IDX image file", "expected a 4-byte magic number at offset 0",
                   fmt::format("file has only {} bytes", at)}});
  }
  for (std::size_t at : {4, 9, 15}) {
    cases.push_back({.what = fmt::format("images cut at {}", at),
                     .images = cut(img, at),
                     .words = {"truncated IDX image file", "expected the 16-byte header",
                               fmt::format("file has only {} bytes", at)}});
  }
  for (std::size_t at : {16, 17, 40, 75}) {
    cases.push_back(
        {.what = fmt::format("images cut at {}", at),
         .images = cut(img, at),
         .words = {"truncated IDX image file", "expected 60 bytes of pixel data at offset 16",
                   fmt::format("file has only {} bytes ({} after the header)", at, at - 16)}});
  }
  for (std::size_t at : {6, 8, 12}) {
    cases.push_back({.what = fmt::format("labels cut at {}", at),
                     .labels = cut(lab, at),
                     .bad_is_labels = true,
                     .words = {"truncated IDX label file",
                               at < 8 ? "expected the 8-byte header" : "expected 5 bytes of labels",
                               fmt::format("file has only {} bytes", at)}});
  }
  cases.push_back({.what = "gzip of a truncated file",
                   .images = gzip(cut(img, 40)),
                   .words = {"truncated IDX image file", "(gzip; offsets count decompressed bytes)",
                             "expected 60 bytes of pixel data at offset 16"}});
  cases.push_back({.what = "trailing bytes",
                   .images = concat_bytes(img, {1, 2, 3}),
                   .words = {"trailing bytes in IDX image file", "3 unexpected bytes at offset 76",
                             "expected 76 bytes in all"}});
  cases.push_back(
      {.what = "wrong magic",
       .images = idx_bytes(0x12345678, {kN, kH, kW}, pixels()),
       .words = {"wrong magic number",
                 "found 0x12345678 at offset 0, expected 0x00000803 for an IDX image file"}});
  cases.push_back({.what = "label magic in a label file position",
                   .labels = idx_bytes(0xCAFEBABE, {kN}, kLabels),
                   .bad_is_labels = true,
                   .words = {"wrong magic number", "found 0xcafebabe",
                             "expected 0x00000801 for an IDX label file"}});
  cases.push_back({.what = "image and label paths swapped",
                   .images = lab,
                   .words = {"wrong number of dimensions in IDX image file",
                             ": 1 (magic 0x00000801 at offset 0), expected 3 (N, H, W)",
                             "are the image and label paths swapped?"}});
  cases.push_back(
      {.what = "2-D images",
       .images = idx_bytes(0x00000802, {kN, kH * kW}, pixels()),
       .words = {"wrong number of dimensions", ": 2 (magic 0x00000802 at offset 0), expected 3"}});
  cases.push_back(
      {.what = "4-D images",
       .images = idx_bytes(0x00000804, {kN, 1, kH, kW}, pixels()),
       .words = {"wrong number of dimensions", ": 4 (magic 0x00000804", "expected 3 (N, H, W)"}});
  cases.push_back({.what = "f32 elements",
                   .images = idx_bytes(0x00000D03, {kN, kH, kW}, pixels()),
                   .words = {"wrong element type", ": f32 (magic 0x00000d03 at offset 0)",
                             "expected unsigned bytes"}});
  cases.push_back({.what = "zero images",
                   .images = idx_bytes(kImageMagic, {0, kH, kW}, {}),
                   .words = {"zero dimension", "[0,3,4]", "expected every dimension > 0"}});
  cases.push_back({.what = "zero height",
                   .images = idx_bytes(kImageMagic, {kN, 0, kW}, {}),
                   .words = {"zero dimension", "[5,0,4]"}});
  cases.push_back({.what = "zero labels",
                   .labels = idx_bytes(kLabelMagic, {0}, {}),
                   .bad_is_labels = true,
                   .words = {"IDX label file", "zero dimension", "[0]"}});
  cases.push_back({.what = "huge dims",
                   .images = idx_bytes(kImageMagic, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}),
                   .words = {"truncated", "expected more than 2^64 bytes of pixel data"}});
  cases.push_back({.what = "count mismatch",
                   .labels = idx_bytes(kLabelMagic, {4}, {1, 2, 3, 4}),
                   .bad_is_labels = true,
                   .words = {"holds 5 images but label file", "holds 4 labels"}});
  cases.push_back({.what = "label out of range",
                   .labels = idx_bytes(kLabelMagic, {kN}, {5, 0, 10, 1, 9}),
                   .bad_is_labels = true,
                   .words = {"label out of range",
                             "sample 2 at byte offset 10 has label 10, expected 0..9 "
                             "(num_classes 10)"}});
  cases.push_back({.what = "missing image file",
                   .images = std::nullopt,
                   .words = {"IDX image file", "cannot open", "it does not exist"}});
  cases.push_back({.what = "missing label file",
                   .labels = std::nullopt,
                   .bad_is_labels = true,
                   .words = {"IDX label file", "cannot open", "it does not exist"}});
  cases.push_back({.what = "directory instead of file",
                   .images = std::nullopt,
                   .words = {"cannot open IDX image file", "it is a directory, expected a file"},
                   .images_is_dir = true});

  const Bytes gz = gzip(img);
  cases.push_back({.what = "gzip cut short",
                   .images = cut(gz, gz.size() / 2),
                   .words = {"corrupt gzip stream",
                             fmt::format("compressed data ends at byte {}", gz.size() / 2)}});
  cases.push_back({.what = "gzip cut after the header",
                   .images = cut(gz, 12),
                   .words = {"corrupt gzip stream", "truncated"}});
  Bytes bad_block = gz;
  bad_block[10] = 0xFF;  // first deflate byte: block type 3 is reserved
  cases.push_back(
      {.what = "gzip with an invalid block",
       .images = bad_block,
       .words = {"corrupt gzip stream", "near compressed byte offset", "invalid block type"}});
  Bytes bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0x01;
  cases.push_back({.what = "gzip with a wrong crc",
                   .images = bad_crc,
                   .words = {"corrupt gzip stream", "incorrect data check"}});
  cases.push_back(
      {.what = "gzip with trailing garbage",
       .images = concat_bytes(gz, {'x', 'y', 'z'}),
       .words = {"corrupt gzip stream",
                 fmt::format("3 bytes of trailing data at compressed byte offset {}", gz.size())}});
  return cases;
}

TEST_F(DatasetsTest, CorruptFilesNameTheFileAndTheProblem) {
  const std::vector<Corrupt> cases = corrupt_cases();
  ASSERT_GE(cases.size(), 30u);
  int i = 0;
  for (const Corrupt& c : cases) {
    SCOPED_TRACE(c.what);
    const fs::path images = dir_ / fmt::format("case{}-images", i);
    const fs::path labels = dir_ / fmt::format("case{}-labels", i);
    ++i;
    if (c.images) write_file(images, *c.images);
    if (c.images_is_dir) fs::create_directory(images);
    if (c.labels) write_file(labels, *c.labels);
    const std::string msg = error_of([&] { read_idx(images, labels, "bad"); });
    EXPECT_THAT(msg, HasSubstr("'" + (c.bad_is_labels ? labels : images).string() + "'"));
    for (const std::string& w : c.words) EXPECT_THAT(msg, HasSubstr(w));
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_FALSE(msg.empty() || std::isupper(static_cast<unsigned char>(msg[0]))) << msg;
  }
}

/// The real data, when MINIDL_DATA_DIR points at it (the data/ root or its mnist/ folder); the
/// Fashion-MNIST checks run too when its folder sits beside mnist/.
TEST(RealMnist, HasTheKnownCountsAndFirstLabels) {
  const char* env = std::getenv("MINIDL_DATA_DIR");
  if (env == nullptr || *env == '\0') {
    GTEST_SKIP() << "MINIDL_DATA_DIR is not set; run scripts/fetch-data and set "
                    "MINIDL_DATA_DIR=data (or data/mnist) to check the real MNIST files";
  }
  fs::path root = fs::path(env).lexically_normal();
  if (!root.has_filename()) root = root.parent_path();  // "data/mnist/"
  fs::path mnist = fs::exists(root / "mnist") ? root / "mnist" : root;
  if (!fs::exists(mnist / "train-images-idx3-ubyte") &&
      !fs::exists(mnist / "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "no MNIST files under MINIDL_DATA_DIR='" << env
                 << "'; run scripts/fetch-data mnist";
  }
  Dataset train = load_mnist(mnist.string(), "train");
  Dataset test = load_mnist(mnist.string(), "test");
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(train.labels.data<std::int32_t>()[0], 5);
  EXPECT_EQ(test.labels.data<std::int32_t>()[0], 7);

  // Fashion-MNIST beside it, if fetched too (both first labels are 9, "ankle boot").
  const fs::path fashion =
      mnist == root ? root.parent_path() / "fashion-mnist" : root / "fashion-mnist";
  if (fs::exists(fashion)) {
    Dataset ftrain = load_mnist(fashion.string(), "train", "fashion-mnist");
    Dataset ftest = load_mnist(fashion.string(), "test", "fashion-mnist");
    EXPECT_EQ(ftrain.size(), 60000);
    EXPECT_EQ(ftest.size(), 10000);
    EXPECT_EQ(ftrain.labels.data<std::int32_t>()[0], 9);
    EXPECT_EQ(ftest.labels.data<std::int32_t>()[0], 9);
  }
}

}  // namespace
}  // namespace minidl

TEST(Datasets, UpscaleReplicatesPixels) {
  using namespace minidl;
  Dataset d;
  d.name = "tiny";
  d.images = Tensor::from(Shape{1, 1, 2, 2}, std::vector<float>{1, 2, 3, 4});
  d.labels = Tensor::from(Shape{1}, std::vector<std::int32_t>{7});
  const Dataset u = upscale(d, 2);
  ASSERT_EQ(u.images.shape(), (Shape{1, 1, 4, 4}));
  const std::vector<float> want{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
  for (std::int64_t i = 0; i < 16; ++i) EXPECT_EQ(u.images.at(i), want[i]) << i;
  EXPECT_EQ(u.labels.data<std::int32_t>()[0], 7);
  EXPECT_THROW(upscale(d, 0), Error);
}
