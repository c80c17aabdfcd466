// Text from outside (file names, names read from files) made safe to print or to write as JSON.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace minidl {

/// s with every byte that is not part of valid UTF-8 written as the four characters "\xHH", so
/// a JSON writer accepts it (a path is bytes, not necessarily UTF-8) and a reader still sees
/// which byte it was. Valid UTF-8 comes back unchanged.
std::string utf8_escaped(std::string_view s);

/// s for an error message: control characters, DEL and bytes that are not valid UTF-8 as "\xHH"
/// (one line stays one line), cut after max_bytes of s with "... (N bytes)" appended.
std::string printable(std::string_view s, std::size_t max_bytes = 200);

}  // namespace minidl
