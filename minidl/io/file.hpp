// Writing whole files so that a reader (or a crash) never sees half of one: the one writer of
// every output (saved parameters, checkpoints, metrics, graph dumps, traces, images).
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace minidl {

/// Writes the pieces, one after another, to "<path>.tmp", syncs it to disk, renames it over
/// path and syncs the directory (best effort: not every file system syncs a directory), so
/// neither a reader nor a crash ever finds half a file at path. On failure the temporary file
/// is removed, path is left as it was, and the Error reads "<what>: cannot write '<path>':
/// <why>".
void write_file_atomically(const std::string& path, std::span<const std::string_view> pieces,
                           std::string_view what);
inline void write_file_atomically(const std::string& path, std::string_view content,
                                  std::string_view what) {
  write_file_atomically(path, std::span<const std::string_view>(&content, 1), what);
}

}  // namespace minidl
