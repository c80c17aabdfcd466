#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = minidl::testing::broadcast_cases();
static const std::vector<BadCase> kBad = minidl::testing::broadcast_bad_cases();
MINIDL_OP_TEST(sub, kCases, kBad)
