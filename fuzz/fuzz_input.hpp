// What the fuzz targets share: the readers take paths, so each input is written to an anonymous
// in-memory file (memfd) and read back through /proc/self/fd. A reader may reject the input
// only with minidl::Error; anything else (a crash, a sanitizer report, another exception)
// is a finding.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "minidl/core/error.hpp"

namespace minidl::fuzz {

/// An in-memory file holding the given bytes, closed when it goes out of scope.
class MemFile {
 public:
  MemFile(const std::uint8_t* data, std::size_t size) : fd_(memfd_create("minidl-fuzz", 0)) {
    if (fd_ < 0) std::abort();
    for (std::size_t done = 0; done < size;) {
      const ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += static_cast<std::size_t>(n);
    }
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

/// Runs fn; a minidl::Error is the reader's refusal, which is fine.
template <typename Fn>
void expect_success_or_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
  }
}

}  // namespace minidl::fuzz
