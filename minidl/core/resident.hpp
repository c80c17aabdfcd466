// The process's resident memory as Linux reports it (/proc/self/status): what a run's memory
// figures are measured by, beside the bytes the runtime plans.
#pragma once

#include <cstdint>
#include <string>

namespace minidl {

/// The peak resident set size of this process so far (VmHWM), in bytes; 0 where the system
/// does not report it. `status`: the text of /proc/self/status (empty: read it).
std::int64_t peak_resident_bytes(const std::string& status = {});

}  // namespace minidl
