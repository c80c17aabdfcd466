#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().attrs({{"shape", minidl::ir::Ints{2, 3}}, {"value", 1.5}}),
};
static const std::vector<BadCase> kBad = {
    {{}, {}, {{"shape", minidl::ir::Ints{2, 0}}}, "dimensions must be positive"},
};
MINIDL_OP_TEST(fill, kCases, kBad)
