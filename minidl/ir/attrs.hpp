// Node attributes: a small ordered map from name to a typed value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "minidl/core/error.hpp"

namespace minidl::ir {

using Ints = std::vector<std::int64_t>;
using AttrValue = std::variant<std::int64_t, double, bool, std::string, Ints>;

/// Readable spelling of an attribute value (3, 0.01, true, "x", [1,2]).
std::string attr_to_string(const AttrValue& v);
/// Name of the alternative held (int, float, bool, string, ints).
std::string_view attr_kind_name(std::size_t index);

template <typename T>
struct AttrStorage {
  using type = T;
};
template <>
struct AttrStorage<int> {
  using type = std::int64_t;
};
template <>
struct AttrStorage<float> {
  using type = double;
};

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
    for (auto& [k, v] : items) set(k, v);
  }

  void set(std::string_view name, AttrValue value);
  bool has(std::string_view name) const { return find(name) != nullptr; }
  const AttrValue* find(std::string_view name) const;
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }

  /// The value of a present attribute as T (int and float read the 64-bit storage).
  template <typename T>
  T get(std::string_view name) const {
    using S = typename AttrStorage<T>::type;
    const AttrValue* v = find(name);
    MINIDL_CHECK(v != nullptr, "missing attribute '", name, "'");
    const S* s = std::get_if<S>(v);
    MINIDL_CHECK(s != nullptr, "attribute '", name, "' holds ", attr_kind_name(v->index()),
                 ", read as another kind");
    return static_cast<T>(*s);
  }

  bool operator==(const Attrs&) const = default;

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;  // sorted by name
};

}  // namespace minidl::ir
