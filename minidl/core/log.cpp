#include "minidl/core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "minidl/core/error.hpp"

namespace minidl {

bool env_switch(const char* name) {
  const char* env = std::getenv(name);
  const std::string v = env != nullptr ? env : "";
  MINIDL_CHECK(v.empty() || v == "on" || v == "off" || v == "1" || v == "0", name,
               " must be on or off (or 1 or 0), got '", v, "'");
  return v != "off" && v != "0";
}

bool verbose(std::string_view topic) {
  static const std::string topics = [] {
    const char* v = std::getenv("MINIDL_VERBOSE");
    std::string t;
    if (v) {
      t.reserve(std::strlen(v) + 2);
      t.push_back(',');
      t.append(v);
      t.push_back(',');
    }
    return t;
  }();
  if (topics.empty()) return false;
  std::string key(1, ',');
  key.append(topic);
  key.push_back(',');
  return topics.find(key) != std::string::npos || topics.find(",all,") != std::string::npos;
}

void log_line(std::string_view level, std::string_view text) {
  fmt::print(stderr, "minidl [{}] {}\n", level, text);
}

}  // namespace minidl
