#include "minidl/io/file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "minidl/core/error.hpp"

namespace minidl {

namespace {
// Writes all of data to fd, resuming after partial writes and signals; errno on failure.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}
}  // namespace

void write_file_atomically(const std::string& path, std::span<const std::string_view> pieces,
                           std::string_view what) {
  namespace fs = std::filesystem;
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    MINIDL_FAIL(what, ": cannot write '", path, "': cannot create '", tmp,
                "': ", std::strerror(errno));
  }
  bool ok = true;
  for (std::string_view piece : pieces) ok = ok && write_all(fd, piece);
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    MINIDL_FAIL(what, ": cannot write '", path, "': writing '", tmp,
                "' failed: ", std::strerror(err != 0 ? err : errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    ::unlink(tmp.c_str());
    MINIDL_FAIL(what, ": cannot write '", path, "': renaming '", tmp, "' failed: ", ec.message());
  }
  // The rename lasts through a crash only once the directory is on disk too.
  const fs::path parent = fs::path(path).parent_path();
  if (const int dir = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY);
      dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

}  // namespace minidl
