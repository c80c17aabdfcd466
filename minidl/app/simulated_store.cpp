#include "minidl/app/simulated_store.hpp"

#include <map>

namespace minidl {
namespace {
// The simulated ranks run one at a time on one real thread: no lock needed.
std::map<std::string, std::shared_ptr<void>>& store() {
  static auto* s = new std::map<std::string, std::shared_ptr<void>>();  // NOLINT: never freed
  return *s;
}
}  // namespace

std::shared_ptr<void> simulated_store_get(const std::string& key) {
  auto it = store().find(key);
  return it == store().end() ? nullptr : it->second;
}

void simulated_store_put(const std::string& key, std::shared_ptr<void> value) {
  store()[key] = std::move(value);
}

}  // namespace minidl
