#include "minidl/core/resident.hpp"

#include <fstream>
#include <sstream>

namespace minidl {

std::int64_t peak_resident_bytes(const std::string& status) {
  std::string text = status;
  if (text.empty()) {
    std::ifstream in("/proc/self/status");
    std::ostringstream s;
    s << in.rdbuf();
    text = s.str();
  }
  // "VmHWM:\t  123456 kB"
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    std::int64_t kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB") return kib * 1024;
    return 0;
  }
  return 0;
}

}  // namespace minidl
