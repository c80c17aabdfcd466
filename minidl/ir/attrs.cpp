#include "minidl/ir/attrs.hpp"

#include <algorithm>

namespace minidl::ir {

std::string attr_to_string(const AttrValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return fmt::format("\"{}\"", x);
        } else if constexpr (std::is_same_v<T, Ints>) {
          return fmt::format("[{}]", fmt::join(x, ","));
        } else {
          return fmt::format("{}", x);
        }
      },
      v);
}

std::string_view attr_kind_name(std::size_t index) {
  static constexpr std::string_view kNames[] = {"int", "float", "bool", "string", "ints"};
  return index < std::size(kNames) ? kNames[index] : "?";
}

void Attrs::set(std::string_view name, AttrValue value) {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, std::string_view n) { return item.first < n; });
  if (it != items_.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items_.insert(it, {std::string(name), std::move(value)});
  }
}

const AttrValue* Attrs::find(std::string_view name) const {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, std::string_view n) { return item.first < n; });
  return it != items_.end() && it->first == name ? &it->second : nullptr;
}

}  // namespace minidl::ir
