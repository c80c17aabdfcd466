#include "minidl/io/file.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "minidl/core/error.hpp"

namespace minidl {

void write_file_atomically(const std::string& path, std::string_view content,
                           std::string_view what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      MINIDL_FAIL(what, ": cannot write '", path, "'");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    MINIDL_FAIL(what, ": cannot write '", path, "': ", ec.message());
  }
}

}  // namespace minidl
