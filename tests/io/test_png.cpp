// The PNG writer, checked by decoding its files here with zlib alone: the signature, the IHDR
// fields, every chunk's CRC-32, IDAT's inflated rows (filter byte and pixels), IEND; images too
// big for one IDAT chunk; bad sizes named; the atomic save; and the grid of images.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "minidl/core/rng.hpp"
#include "minidl/io/png.hpp"
#include "support/error_of.hpp"
#include "support/temp_dir.hpp"

using namespace minidl;
using minidl::testing::error_of;
using ::testing::HasSubstr;

namespace {

std::uint32_t be32(const std::string& s, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<std::uint8_t>(s[at + i]);
  return v;
}

struct Decoded {
  std::vector<std::string> chunks;  // types, in file order
  std::string ihdr;
  GrayImage image;
};

// A strict decoder for what encode_png writes: every check a test failure.
Decoded decode(const std::string& png) {
  Decoded d;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  std::size_t at = 8;
  while (at + 12 <= png.size()) {
    const std::uint32_t n = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    EXPECT_LE(at + 12 + n, png.size()) << type;
    const std::string data = png.substr(at + 8, n);
    const uLong crc = crc32(crc32(0L, reinterpret_cast<const Bytef*>(png.data() + at + 4), 4),
                            reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(n));
    EXPECT_EQ(be32(png, at + 8 + n), static_cast<std::uint32_t>(crc)) << "CRC of " << type;
    d.chunks.push_back(type);
    if (type == "IHDR") d.ihdr = data;
    if (type == "IDAT") idat += data;
    at += 12 + n;
  }
  EXPECT_EQ(at, png.size()) << "bytes after the last chunk";
  if (d.ihdr.size() != 13) {
    ADD_FAILURE() << "IHDR of " << d.ihdr.size() << " bytes";
    return d;
  }
  d.image.width = be32(d.ihdr, 0);
  d.image.height = be32(d.ihdr, 4);
  std::vector<std::uint8_t> raw(static_cast<std::size_t>((d.image.width + 1) * d.image.height));
  uLongf size = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &size, reinterpret_cast<const Bytef*>(idat.data()),
                       static_cast<uLong>(idat.size())),
            Z_OK);
  EXPECT_EQ(size, raw.size());
  for (std::int64_t y = 0; y < d.image.height; ++y) {
    const std::uint8_t* row = raw.data() + y * (d.image.width + 1);
    EXPECT_EQ(row[0], 0) << "filter byte of row " << y;
    d.image.pixels.insert(d.image.pixels.end(), row + 1, row + 1 + d.image.width);
  }
  return d;
}

GrayImage gradient(std::int64_t w, std::int64_t h) {
  GrayImage g{w, h, {}};
  for (std::int64_t i = 0; i < w * h; ++i) g.pixels.push_back(static_cast<std::uint8_t>(i * 7));
  return g;
}

}  // namespace

TEST(Png, WritesTheHeaderTheRowsAndTheCrcs) {
  const GrayImage g = gradient(5, 3);
  const Decoded d = decode(encode_png(g));
  EXPECT_EQ(d.chunks, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  // width 5, height 3, bit depth 8, grayscale, deflate, adaptive filtering, not interlaced
  EXPECT_EQ(d.ihdr, std::string("\0\0\0\5\0\0\0\3\x08\0\0\0\0", 13));
  EXPECT_EQ(d.image.pixels, g.pixels);
}

TEST(Png, CutsLargeImagesIntoSeveralIdatChunks) {
  GrayImage g{1200, 1100, {}};  // noise: about 1.3 MB compressed
  const CounterRng rng(3);
  for (std::int64_t i = 0; i < g.width * g.height; ++i)
    g.pixels.push_back(static_cast<std::uint8_t>(rng.bits(0, i)));
  const std::string png = encode_png(g);
  const Decoded d = decode(png);
  EXPECT_EQ(std::count(d.chunks.begin(), d.chunks.end(), "IDAT"), 2);
  EXPECT_EQ(be32(png, 33), 1u << 20) << "the first IDAT chunk's length";
  EXPECT_EQ(d.image.width, 1200);
  EXPECT_EQ(d.image.height, 1100);
  EXPECT_TRUE(d.image.pixels == g.pixels);
}

TEST(Png, RefusesImagesPngCannotHold) {
  EXPECT_THAT(error_of([] {
                encode_png(GrayImage{0, 5, {}});
              }),
              HasSubstr("encode_png: the image is 0x5 pixels; PNG takes 1 to 2147483647 per side"));
  EXPECT_THAT(error_of([] { encode_png(GrayImage{4, 0, {}}); }), HasSubstr("4x0 pixels"));
  EXPECT_THAT(error_of([] { encode_png(GrayImage{-1, 2, {0, 0}}); }), HasSubstr("-1x2 pixels"));
  EXPECT_THAT(error_of([] {
                encode_png(GrayImage{std::int64_t{1} << 31, 1, {}});
              }),
              HasSubstr("2147483648x1 pixels"));
  EXPECT_THAT(error_of([] {
                encode_png(GrayImage{3, 2, {1, 2, 3, 4, 5}});
              }),
              HasSubstr("encode_png: a 3x2 image needs 6 pixels, got 5"));
}

class PngFile : public minidl::testing::TempDirTest {};

TEST_F(PngFile, SavesTheEncodedBytesAndNamesAnUnwritablePath) {
  const GrayImage g = gradient(4, 4);
  save_png(path("g.png"), g);
  std::ifstream f(path("g.png"), std::ios::binary);
  std::stringstream bytes;
  bytes << f.rdbuf();
  EXPECT_EQ(bytes.str(), encode_png(g));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1) << "a .tmp is left";
  const std::string missing = path("no/such/dir/g.png");
  EXPECT_THAT(error_of([&] { save_png(missing, g, "--png"); }),
              HasSubstr("--png: cannot write '" + missing + "'"));
  // A bad image fails before anything is written.
  EXPECT_THAT(error_of([&] { save_png(path("bad.png"), GrayImage{}); }), HasSubstr("0x0"));
  EXPECT_FALSE(std::filesystem::exists(path("bad.png")));
}

// Two blocks of 2x2 images, 2 to a row, gap 1: block 0's three images take two rows (the
// fourth place stays background), block 1 starts the third row.
TEST(ImageGrid, PlacesEachBlockOnRowsOfItsOwn) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = Tensor::from(Shape{3, 4}, std::vector<float>{0, 1, 0.5f, 0.2f,  //
                                                                -3, 7, nan, 1,     //
                                                                1, 1, 1, 1});
  const Tensor b = Tensor::from(Shape{1, 1, 2, 2}, std::vector<float>{0.25f, 0, 0, 0.75f});
  const GrayImage g = image_grid({a, b}, 2, 2, 2, 1, 100);
  ASSERT_EQ(g.width, 2 * 2 + 3 * 1);
  ASSERT_EQ(g.height, 3 * 2 + 4 * 1);
  auto at = [&](std::int64_t x, std::int64_t y) { return int{g.pixels[y * g.width + x]}; };
  // Image 0 of block 0 at (1, 1): 0 -> 0, 1 -> 255, 0.5 -> 128 (rounded), 0.2 -> 51.
  EXPECT_EQ(at(1, 1), 0);
  EXPECT_EQ(at(2, 1), 255);
  EXPECT_EQ(at(1, 2), 128);
  EXPECT_EQ(at(2, 2), 51);
  // Image 1 at (4, 1), clamped: -3 -> 0, 7 -> 255, NaN -> 0.
  EXPECT_EQ(at(4, 1), 0);
  EXPECT_EQ(at(5, 1), 255);
  EXPECT_EQ(at(4, 2), 0);
  // Image 2 on the second row at (1, 4); the place beside it is background.
  EXPECT_EQ(at(1, 4), 255);
  EXPECT_EQ(at(4, 4), 100);
  // Block 1 on the third row at (1, 7): 0.25 -> 64, 0.75 -> 191.
  EXPECT_EQ(at(1, 7), 64);
  EXPECT_EQ(at(2, 8), 191);
  // Gaps and frame.
  EXPECT_EQ(at(0, 0), 100);
  EXPECT_EQ(at(3, 1), 100);
  EXPECT_EQ(at(1, 6), 100);
  EXPECT_EQ(at(6, 9), 100);
}

TEST(ImageGrid, NamesABlockOfPartImages) {
  const Tensor ok = Tensor::zeros({2, 4});
  EXPECT_THAT(error_of([&] {
                image_grid({ok, Tensor::zeros({2, 3})}, 2, 2, 2);
              }),
              HasSubstr("image_grid: block 1 (f32 [2,3]) does not hold whole f32 images of 2x2 "
                        "values"));
  EXPECT_THAT(error_of([&] { image_grid({Tensor::zeros({4}, DType::I32)}, 2, 2, 2); }),
              HasSubstr("block 0 (i32 [4])"));
  EXPECT_THAT(error_of([&] { image_grid({ok}, 2, 2, 0); }), HasSubstr("0 to a row"));
  EXPECT_THAT(error_of([&] { image_grid({}, 2, 2, 2); }), HasSubstr("image_grid: no images"));
}
