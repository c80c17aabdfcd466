// Writing whole files so that a reader (or a crash) never sees half of one.
#pragma once

#include <string>
#include <string_view>

namespace minidl {

/// Writes content to "<path>.tmp" and renames it over path. On failure the temporary file is
/// removed, path is left as it was, and the Error reads "<what>: cannot write '<path>'[: why]".
void write_file_atomically(const std::string& path, std::string_view content,
                           std::string_view what);

}  // namespace minidl
