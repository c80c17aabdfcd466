// .safetensors reader: the input is the file.
#include "fuzz_input.hpp"
#include "minidl/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  minidl::fuzz::MemFile file(data, size);
  minidl::fuzz::expect_success_or_error([&] { minidl::load_safetensors(file.path()); });
  return 0;
}
