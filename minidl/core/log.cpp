#include "minidl/core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace minidl {

bool verbose(std::string_view topic) {
  static const std::string topics = [] {
    const char* v = std::getenv("MINIDL_VERBOSE");
    return v ? "," + std::string(v) + "," : std::string();
  }();
  if (topics.empty()) return false;
  return topics.find("," + std::string(topic) + ",") != std::string::npos ||
         topics.find(",all,") != std::string::npos;
}

void log_line(std::string_view level, std::string_view text) {
  fmt::print(stderr, "minidl [{}] {}\n", level, text);
}

}  // namespace minidl
