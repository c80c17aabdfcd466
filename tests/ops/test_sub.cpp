#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 5}, {4, 5}}),
    OpCase().shapes({{3, 2, 2, 7}, {3, 2, 2, 7}}),
    OpCase().shapes({{4, 5}, {5}}),
    OpCase().shapes({{4, 1}, {1, 5}}),
    OpCase().shapes({{2, 3, 4, 5}, {1, 3, 1, 1}}),
    OpCase().shapes({{3}, {2, 1, 3}}),
    OpCase().shapes({{}, {3, 2}}),
};
static const std::vector<BadCase> kBad = {
    {{{4, 5}, {5, 4}}, {}, {}, "cannot broadcast [4,5] with [5,4]"},
};
MINIDL_OP_TEST(sub, kCases, kBad)
