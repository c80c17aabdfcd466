#include "minidl/io/file.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "minidl/core/error.hpp"

namespace minidl {

namespace {

namespace fs = std::filesystem;

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

/// The directory path is in ("." for a bare name).
std::string directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

/// A new file "<path>.tmp.XXXXXX" (six random letters or digits), created exclusively and
/// without following a symlink; its descriptor, or -1 with errno set.
int create_temporary(const std::string& path, std::string& tmp) {
  static constexpr char kLetters[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  for (int attempt = 0; attempt < 100; ++attempt) {
    unsigned char random[6];
    if (::getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
      // No entropy at hand: the process id and the attempt still make the name unusual, and
      // O_EXCL keeps it safe.
      for (std::size_t i = 0; i < sizeof random; ++i)
        random[i] = static_cast<unsigned char>((::getpid() >> (4 * i)) + 31 * attempt + i);
    }
    tmp = path + ".tmp.";
    for (unsigned char r : random) tmp += kLetters[r % (sizeof kLetters - 1)];
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/// Syncs the directory, so that a rename in it lasts through a crash (best effort: not every
/// file system syncs a directory).
void sync_directory(const std::string& dir) {
  if (const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

/// Why a file cannot be written at path (empty: it can): a directory in its way, a missing or
/// unwritable directory.
std::string why_not_writable(const std::string& path) {
  std::error_code ec;
  if (path.empty()) return "the path is empty";
  if (fs::is_directory(fs::symlink_status(path, ec))) return "it is a directory";
  const std::string dir = directory_of(path);
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return "the directory '" + dir + "' does not exist";
  if (!fs::is_directory(st)) return "'" + dir + "' is not a directory";
  std::string tmp;
  const int fd = create_temporary(path, tmp);
  if (fd < 0) return "cannot create a file in '" + dir + "': " + std::strerror(errno);
  ::close(fd);
  ::unlink(tmp.c_str());
  return {};
}

}  // namespace

void write_file_atomically(const std::string& path, std::span<const std::string_view> pieces,
                           std::string_view what) {
  std::string tmp;
  const int fd = create_temporary(path, tmp);
  if (fd < 0) {
    const int err = errno;
    const std::string why = why_not_writable(path);
    MINIDL_FAIL(
        what, ": cannot write '", path, "': ",
        why.empty() ? std::string("cannot create a temporary file: ") + std::strerror(err) : why);
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
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    MINIDL_FAIL(what, ": cannot write '", path, "': renaming '", tmp,
                "' failed: ", std::strerror(rename_err));
  }
  sync_directory(directory_of(path));
}

void check_writable(const std::string& path, std::string_view what) {
  const std::string why = why_not_writable(path);
  MINIDL_CHECK(why.empty(), what, ": cannot write '", path, "': ", why);
}

void check_writable_directory(const std::string& dir, std::string_view what) {
  MINIDL_CHECK(!dir.empty(), what, ": the directory name is empty");
  std::error_code ec;
  fs::path existing = fs::path(dir);
  // The nearest part of the path that exists: the directory itself, or where it would be made.
  while (!fs::exists(fs::symlink_status(existing, ec)) && existing.has_relative_path() &&
         existing.has_parent_path() && existing.parent_path() != existing)
    existing = existing.parent_path();
  if (!fs::exists(fs::symlink_status(existing, ec))) existing = ".";
  const fs::file_status st = fs::status(existing, ec);
  MINIDL_CHECK(fs::is_directory(st), what, ": cannot write in '", dir, "': '", existing.string(),
               "' is ", fs::exists(st) ? "not a directory" : "a broken symlink");
  std::string tmp;
  const int fd = create_temporary((existing / ".minidl-check").string(), tmp);
  if (fd < 0) {
    MINIDL_FAIL(what, ": cannot write in '", dir, "': cannot create a file in '", existing.string(),
                "': ", std::strerror(errno));
  }
  ::close(fd);
  ::unlink(tmp.c_str());
}

InputFile::~InputFile() {
  if (fd >= 0) ::close(fd);
}

InputFile open_input(const std::string& path, std::string_view what) {
  InputFile f;
  // O_NONBLOCK: opening a FIFO does not wait for a writer; it is refused below.
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f.fd < 0) {
    const int err = errno;
    MINIDL_CHECK(err != ENOENT, "cannot open ", what, " '", path, "': it does not exist");
    MINIDL_FAIL("cannot open ", what, " '", path, "': ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    MINIDL_FAIL("cannot open ", what, " '", path, "': ", std::strerror(errno));
  }
  MINIDL_CHECK(!S_ISDIR(st.st_mode), "cannot open ", what, " '", path,
               "': it is a directory, expected a file");
  MINIDL_CHECK(S_ISREG(st.st_mode), "cannot open ", what, " '", path, "': it is ",
               S_ISCHR(st.st_mode)    ? "a character device"
               : S_ISBLK(st.st_mode)  ? "a block device"
               : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
               : S_ISSOCK(st.st_mode) ? "a socket"
                                      : "not a regular file",
               ", expected a regular file");
  const int flags = ::fcntl(f.fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK);
  f.size = static_cast<std::uint64_t>(st.st_size);
  return f;
}

std::size_t read_input(InputFile& f, void* dst, std::size_t n, const std::string& path,
                       std::string_view what) {
  std::size_t done = 0;
  auto* out = static_cast<char*>(dst);
  while (done < n) {
    const ssize_t got = ::read(f.fd, out + done, std::min<std::size_t>(n - done, 1 << 30));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      MINIDL_FAIL("cannot read ", what, " '", path, "': ", std::strerror(errno), " after ", done,
                  " bytes");
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

}  // namespace minidl
