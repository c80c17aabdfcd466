#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

// Divisors kept away from 0.
static const std::vector<OpCase> kCases = [] {
  std::vector<OpCase> cases = minidl::testing::broadcast_cases();
  for (OpCase& c : cases) c.positive(0.5);
  return cases;
}();
static const std::vector<BadCase> kBad = minidl::testing::broadcast_bad_cases();
MINIDL_OP_TEST(div, kCases, kBad)
