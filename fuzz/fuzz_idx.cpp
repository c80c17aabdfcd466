// IDX reader (raw or gzip): the first four bytes (little-endian) say how many of the rest form
// the image file (modulo its size), so an image file may be larger than 64 KiB; the remainder is
// the label file.
#include "fuzz_input.hpp"
#include "minidl/io/datasets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const std::size_t rest = size - 4;
  const std::size_t split = rest == 0
                                ? 0
                                : (data[0] | (std::size_t{data[1]} << 8) |
                                   (std::size_t{data[2]} << 16) | (std::size_t{data[3]} << 24)) %
                                      (rest + 1);
  minidl::fuzz::MemFile images(data + 4, split), labels(data + 4 + split, rest - split);
  minidl::fuzz::expect_success_or_error(
      [&] { minidl::read_idx(images.path(), labels.path(), "fuzz"); });
  return 0;
}
