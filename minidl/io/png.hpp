// PNG images, 8-bit grayscale: enough to look at what a model makes of its inputs (an
// autoencoder's reconstructions beside the originals). Written whole through the atomic writer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "minidl/core/tensor.hpp"

namespace minidl {

/// An 8-bit grayscale image, row-major: pixels[y * width + x], 0 black, 255 white.
struct GrayImage {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
};

/// The bytes of a PNG file holding image: the signature, IHDR (bit depth 8, colour type 0,
/// no interlacing), the zlib-compressed rows (each after filter byte 0) in IDAT chunks of at
/// most 1 MiB, and IEND; every chunk with its CRC-32. Throws minidl::Error when a side is not
/// in [1, 2^31 - 1] (PNG's range) or pixels does not hold width * height bytes.
std::string encode_png(const GrayImage& image);

/// Writes encode_png(image) to path with write_file_atomically: no half-written file is ever at
/// path; a failure reads "<what>: cannot write '<path>'...".
void save_png(const std::string& path, const GrayImage& image, std::string_view what = "PNG");

/// Tiles f32 images of height x width values into one image, `columns` to a row: each tensor of
/// `blocks` holds whole images ([N, H, W], [N, 1, H, W] or [N, H * W] alike) and starts a new
/// row, so blocks of the same size stack, e.g. inputs above their reconstructions. Values are
/// clamped to [0, 1] (NaN counts as 0) and scaled to 0..255, rounded; `gap` pixels of
/// `background` separate the images and frame the grid, and fill the empty places of a block's
/// last row. Throws minidl::Error naming the block whose values are not whole f32 images.
GrayImage image_grid(const std::vector<Tensor>& blocks, std::int64_t height, std::int64_t width,
                     std::int64_t columns, std::int64_t gap = 2, std::uint8_t background = 128);

}  // namespace minidl
