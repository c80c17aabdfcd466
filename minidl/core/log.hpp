// fmt-based logging to stderr. MINIDL_VERBOSE is a comma-separated list of topics
// (dispatch, memory, passes, all) that turns on the matching detail messages.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace minidl {

/// True when MINIDL_VERBOSE names topic (or "all").
bool verbose(std::string_view topic);
/// The on/off switch `name` in the environment (MINIDL_DIRECT_CONV, MINIDL_WINOGRAD): false for
/// "off" or "0", true for "on", "1" or unset; any other value is an error naming the variable.
bool env_switch(const char* name);

void log_line(std::string_view level, std::string_view text);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  log_line("info", fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  log_line("warning", fmt::format(f, std::forward<Args>(args)...));
}
/// Prints only when MINIDL_VERBOSE names topic.
template <typename... Args>
void log_verbose(std::string_view topic, fmt::format_string<Args...> f, Args&&... args) {
  if (verbose(topic)) log_line(topic, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace minidl
