#include "minidl/core/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

namespace minidl {

std::size_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

std::string format_bytes(std::size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30)) return fmt::format("{:.1f} GiB", b / (1 << 30));
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (std::size_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

void check_fits_in_memory(std::size_t bytes, const std::string& what) {
  if (bytes < (std::size_t{64} << 20)) return;
  const std::size_t avail = available_memory();
  MINIDL_CHECK(avail == 0 || bytes <= avail, what, " needs ", format_bytes(bytes),
               ", more than the ", format_bytes(avail), " of memory available");
}

Storage::Storage(std::size_t nbytes) : nbytes_(nbytes) {
  std::size_t rounded =
      (std::max<std::size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  MINIDL_CHECK(data_ != nullptr, "cannot allocate ", format_bytes(nbytes), ": out of memory");
}

Storage::~Storage() { std::free(data_); }

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (auto d : shape.dims()) MINIDL_CHECK(d >= 0, "negative dimension in shape ", shape);
  std::size_t bytes = dtype_size(dtype);
  for (auto d : shape.dims()) {
    MINIDL_CHECK(d == 0 || bytes <= SIZE_MAX / static_cast<std::size_t>(d), "a tensor of shape ",
                 shape, " ", dtype, " has more bytes than memory can address");
    bytes *= static_cast<std::size_t>(d);
  }
  check_fits_in_memory(bytes, fmt::format("a tensor of shape {} {}", shape, dtype));
  Tensor t;
  t.storage_ =
      std::make_shared<Storage>(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  t.data_ = t.storage_->data();
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::full(Shape shape, float value) {
  Tensor t = empty(std::move(shape), DType::F32);
  std::fill_n(t.data<float>(), t.numel(), value);
  return t;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  MINIDL_CHECK(shape.numel() == numel(), "cannot reshape ", shape_, " (", numel(), " elements) to ",
               shape, " (", shape.numel(), " elements)");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  if (nbytes() > 0) std::memcpy(t.data_, data_, nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MINIDL_CHECK(src.numel() == numel() && src.dtype() == dtype_, "cannot copy a ", src.dtype(),
               " tensor of shape ", src.shape(), " into a ", dtype_, " tensor of shape ", shape_);
  if (nbytes() > 0) std::memcpy(data_, src.data_, nbytes());
}

}  // namespace minidl
