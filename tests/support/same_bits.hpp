// Whether two lists of named tensors are the same names with the same bytes, in the same order:
// the check of every bitwise-equivalence test (deterministic layouts, resume, accumulation).
#pragma once

#include <cstring>

#include "minidl/core/tensor.hpp"

namespace minidl::testing {

inline bool same_bits(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || a[i].second.nbytes() != b[i].second.nbytes()) return false;
    if (std::memcmp(a[i].second.raw(), b[i].second.raw(), a[i].second.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace minidl::testing
