#include "minidl/core/text.hpp"

#include <fmt/format.h>

namespace minidl {

namespace {

/// The length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 when there is none:
/// no overlong forms, no surrogates, nothing above U+10FFFF.
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (i + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  return n;
}

std::string escaped(std::string_view s, bool controls) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    const auto c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (controls && n == 1 && (c < 0x20 || c == 0x7f))) {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace

std::string utf8_escaped(std::string_view s) { return escaped(s, false); }

std::string printable(std::string_view s, std::size_t max_bytes) {
  if (s.size() <= max_bytes) return escaped(s, true);
  // Cut at a character boundary, not inside a UTF-8 sequence.
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", escaped(s.substr(0, cut), true), s.size());
}

}  // namespace minidl
