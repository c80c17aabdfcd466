#include "minidl/io/png.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "minidl/core/error.hpp"
#include "minidl/io/file.hpp"

namespace minidl {

namespace {

constexpr std::int64_t kMaxSide = 0x7fffffff;                // PNG's largest width and height
constexpr std::size_t kMaxIdatBytes = std::size_t{1} << 20;  // IDAT chunks are cut at this size

void put32(std::string& out, std::uint32_t v) {  // big-endian, as PNG stores every integer
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

// Length, type, data, and the CRC-32 of type and data.
void put_chunk(std::string& out, const char (&type)[5], const std::uint8_t* data, std::size_t n) {
  put32(out, static_cast<std::uint32_t>(n));
  out.append(type, 4);
  out.append(reinterpret_cast<const char*>(data), n);
  uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(type), 4);
  if (n > 0) crc = crc32(crc, data, static_cast<uInt>(n));
  put32(out, static_cast<std::uint32_t>(crc));
}

}  // namespace

std::string encode_png(const GrayImage& image) {
  const std::int64_t w = image.width, h = image.height;
  MINIDL_CHECK(w >= 1 && h >= 1 && w <= kMaxSide && h <= kMaxSide, "encode_png: the image is ", w,
               "x", h, " pixels; PNG takes 1 to ", kMaxSide, " per side");
  MINIDL_CHECK(static_cast<std::int64_t>(image.pixels.size()) == w * h, "encode_png: a ", w, "x", h,
               " image needs ", w * h, " pixels, got ", image.pixels.size());
  // Each row: filter type 0 (None), then its bytes.
  std::vector<std::uint8_t> raw(static_cast<std::size_t>((w + 1) * h));
  for (std::int64_t y = 0; y < h; ++y) {
    std::uint8_t* row = raw.data() + y * (w + 1);
    row[0] = 0;
    std::memcpy(row + 1, image.pixels.data() + y * w, static_cast<std::size_t>(w));
  }
  uLongf packed_size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<std::uint8_t> packed(packed_size);
  const int z = compress2(packed.data(), &packed_size, raw.data(), static_cast<uLong>(raw.size()),
                          Z_DEFAULT_COMPRESSION);
  MINIDL_CHECK(z == Z_OK, "encode_png: zlib could not compress the ", w, "x", h, " image (error ",
               z, ")");

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::uint8_t ihdr[13];
  for (int i = 0; i < 4; ++i) {
    ihdr[i] = static_cast<std::uint8_t>(w >> (24 - 8 * i));
    ihdr[4 + i] = static_cast<std::uint8_t>(h >> (24 - 8 * i));
  }
  ihdr[8] = 8;                         // bit depth
  ihdr[9] = 0;                         // colour type: grayscale
  ihdr[10] = ihdr[11] = ihdr[12] = 0;  // deflate, adaptive filtering, no interlace
  put_chunk(out, "IHDR", ihdr, sizeof ihdr);
  for (std::size_t at = 0; at < packed_size; at += kMaxIdatBytes)
    put_chunk(out, "IDAT", packed.data() + at,
              std::min<std::size_t>(kMaxIdatBytes, packed_size - at));
  put_chunk(out, "IEND", nullptr, 0);
  return out;
}

void save_png(const std::string& path, const GrayImage& image, std::string_view what) {
  write_file_atomically(path, encode_png(image), what);
}

GrayImage image_grid(const std::vector<Tensor>& blocks, std::int64_t height, std::int64_t width,
                     std::int64_t columns, std::int64_t gap, std::uint8_t background) {
  MINIDL_CHECK(height >= 1 && width >= 1 && columns >= 1 && gap >= 0, "image_grid: images of ",
               height, "x", width, " pixels, ", columns, " to a row, gaps of ", gap,
               ": expected positive sizes and a gap of at least 0");
  const std::int64_t pixels = height * width;
  std::int64_t rows = 0;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const Tensor& t = blocks[b];
    MINIDL_CHECK(t.dtype() == DType::F32 && t.numel() > 0 && t.numel() % pixels == 0,
                 "image_grid: block ", b, " (", t.dtype(), " ", t.shape(),
                 ") does not hold whole f32 images of ", height, "x", width, " values");
    rows += (t.numel() / pixels + columns - 1) / columns;
  }
  MINIDL_CHECK(rows > 0, "image_grid: no images");
  GrayImage g;
  g.width = columns * width + (columns + 1) * gap;
  g.height = rows * height + (rows + 1) * gap;
  g.pixels.assign(static_cast<std::size_t>(g.width * g.height), background);
  std::int64_t row = 0;
  for (const Tensor& t : blocks) {
    const std::int64_t n = t.numel() / pixels;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t top = gap + (row + i / columns) * (height + gap);
      const std::int64_t left = gap + (i % columns) * (width + gap);
      const float* src = t.data<float>() + i * pixels;
      for (std::int64_t y = 0; y < height; ++y) {
        for (std::int64_t x = 0; x < width; ++x) {
          const float v = src[y * width + x];
          const float c = std::isnan(v) ? 0.0f : std::clamp(v, 0.0f, 1.0f);
          g.pixels[static_cast<std::size_t>((top + y) * g.width + left + x)] =
              static_cast<std::uint8_t>(std::lround(c * 255.0f));
        }
      }
    }
    row += (n + columns - 1) / columns;
  }
  return g;
}

}  // namespace minidl
