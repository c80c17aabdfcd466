// Files in and out. The one writer of every output (saved parameters, checkpoints, metrics,
// graph dumps, traces, images): whole files, so that a reader (or a crash) never sees half of
// one, through a temporary file no one else can have planted. The one way readers open their
// input: a regular file, so a device or a FIFO is refused before anything waits or allocates.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace minidl {

/// Writes the pieces, one after another, to a new temporary file in path's directory (created
/// exclusively with a unique name "<name>.tmp.XXXXXX", O_CREAT|O_EXCL|O_NOFOLLOW: never a
/// file or symlink someone planted), syncs it to disk, renames it over path and syncs the
/// directory, so neither a reader nor a crash ever finds half a file at path. On failure the
/// temporary file is removed, path is left as it was, and the Error reads "<what>: cannot write
/// '<path>': <why>".
void write_file_atomically(const std::string& path, std::span<const std::string_view> pieces,
                           std::string_view what);
inline void write_file_atomically(const std::string& path, std::string_view content,
                                  std::string_view what) {
  write_file_atomically(path, std::span<const std::string_view>(&content, 1), what);
}

/// Whether write_file_atomically(path, ...) can succeed, checked without leaving anything behind:
/// path is not a directory and a temporary file can be created (and is removed) in its directory.
/// Throws "<what>: cannot write '<path>': <why>" otherwise.
void check_writable(const std::string& path, std::string_view what);

/// Whether files can later be written in the directory dir, which may not exist yet (it would be
/// created with its missing parents): the nearest existing ancestor is a directory that takes a
/// temporary file. Creates nothing; throws "<what>: cannot write in '<dir>': <why>".
void check_writable_directory(const std::string& dir, std::string_view what);

/// A file opened for reading: the descriptor and the size the file system gives.
struct InputFile {
  int fd = -1;
  std::uint64_t size = 0;
  InputFile() = default;
  InputFile(InputFile&& o) noexcept : fd(o.fd), size(o.size) { o.fd = -1; }
  InputFile& operator=(InputFile&&) = delete;
  ~InputFile();
};

/// Opens path for reading; what names it in errors ("IDX image file"). Refuses, with an error
/// naming the file, anything missing, a directory, and anything that is not a regular file (a
/// device such as /dev/zero, a FIFO, a socket): those have no size to check a header against.
/// Never blocks on a FIFO.
InputFile open_input(const std::string& path, std::string_view what);

/// Reads up to n bytes at the file's current position; fewer only at the end of the file.
/// Throws "cannot read <what> '<path>': <why> after <k> bytes" on an error.
std::size_t read_input(InputFile& f, void* dst, std::size_t n, const std::string& path,
                       std::string_view what);

}  // namespace minidl
