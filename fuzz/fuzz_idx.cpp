// IDX reader (raw or gzip): the first two bytes say how many of the rest form the image file
// (modulo its size); the remainder is the label file.
#include "fuzz_input.hpp"
#include "minidl/io/datasets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t rest = size - 2;
  const std::size_t split = rest == 0 ? 0 : (data[0] | (std::size_t{data[1]} << 8)) % (rest + 1);
  minidl::fuzz::MemFile images(data + 2, split), labels(data + 2 + split, rest - split);
  minidl::fuzz::expect_success_or_error(
      [&] { minidl::read_idx(images.path(), labels.path(), "fuzz"); });
  return 0;
}
