// Element types of tensors: f32 for data, i32/i64 for labels and indices, bf16 for activations
// stored in bf16 between bf16 kernels (--precision bf16; see ir::Value::stored).
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace minidl {

enum class DType : std::uint8_t { F32, I32, I64, BF16 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::BF16:
      return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::I32:
      return "i32";
    case DType::I64:
      return "i64";
    case DType::BF16:
      return "bf16";
  }
  return "?";
}

/// The safetensors spelling (F32, I32, I64, BF16).
constexpr std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
    case DType::BF16:
      return "BF16";
  }
  return "?";
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::I64;
}

}  // namespace minidl

template <>
struct fmt::formatter<minidl::DType> : fmt::formatter<std::string_view> {
  auto format(minidl::DType t, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(minidl::dtype_name(t), ctx);
  }
};
