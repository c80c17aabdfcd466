#include "minidl/core/tensor.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace minidl {

Storage::Storage(std::size_t nbytes) : nbytes_(nbytes) {
  std::size_t rounded =
      (std::max<std::size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  if (data_ == nullptr) throw std::bad_alloc();
}

Storage::~Storage() { std::free(data_); }

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (auto d : shape.dims()) MINIDL_CHECK(d >= 0, "negative dimension in shape ", shape);
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
