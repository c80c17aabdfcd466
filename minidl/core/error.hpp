// minidl::Error and the checking macros every layer uses to report bad input.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace minidl {

/// The one exception type minidl throws for anything a user can act on. The message names the
/// problem (file and offset, node and shapes, flag and allowed values) and starts lower-case.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename T>
void append_piece(std::string& out, const T& piece) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(piece);
  } else {
    fmt::format_to(std::back_inserter(out), "{}", piece);
  }
}

/// Concatenates the pieces, formatting each with fmt: concat("x=", shape, " n=", 3).
template <typename... Args>
std::string concat(const Args&... args) {
  std::string out;
  (append_piece(out, args), ...);
  return out;
}

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace minidl

/// Throws minidl::Error with the concatenated message when cond is false.
#define MINIDL_CHECK(cond, ...)                                                \
  do {                                                                         \
    if (!(cond)) throw ::minidl::Error(::minidl::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Throws minidl::Error unconditionally.
#define MINIDL_FAIL(...) throw ::minidl::Error(::minidl::detail::concat(__VA_ARGS__))

/// Our own invariants (not user input): aborts with the location when violated.
#define MINIDL_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::minidl::detail::assert_fail(#cond, __FILE__, __LINE__,                                \
                                    ::minidl::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
