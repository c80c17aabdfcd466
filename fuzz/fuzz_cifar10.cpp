// CIFAR-10 binary batch reader (raw or gzip): the input is one batch file.
#include "fuzz_input.hpp"
#include "minidl/io/datasets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  minidl::fuzz::MemFile batch(data, size);
  // Any number of records (0): the official count of 10000 would turn away nearly every input.
  minidl::fuzz::expect_success_or_error([&] { minidl::read_cifar10({batch.path()}, "fuzz", 0); });
  return 0;
}
