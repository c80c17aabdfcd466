// Shape: the dimensions of a tensor, outermost first ([N, C, H, W], [rows, cols]).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace minidl {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  /// Dimension i; negative i counts from the end.
  std::int64_t operator[](int i) const { return dims_[i < 0 ? i + rank() : i]; }
  std::int64_t& operator[](int i) { return dims_[i < 0 ? i + rank() : i]; }
  /// Number of elements (1 for a scalar of rank 0).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  bool operator==(const Shape&) const = default;
  std::string str() const { return fmt::format("[{}]", fmt::join(dims_, ",")); }

 private:
  std::vector<std::int64_t> dims_;
};

}  // namespace minidl

template <>
struct fmt::formatter<minidl::Shape> : fmt::formatter<std::string_view> {
  auto format(const minidl::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(s.str(), ctx);
  }
};
