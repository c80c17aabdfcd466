#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{5, 7}, {7}}),
    OpCase().shapes({{2, 3, 4, 5}, {3}}),
    OpCase().shapes({{1, 1}, {1}}),
};
static const std::vector<BadCase> kBad = {
    {{{5, 7}, {6}}, {}, {}, "bias must be [7]"},
    {{{7}, {7}}, {}, {}, "rank >= 2"},
};
MINIDL_OP_TEST(bias_add, kCases, kBad)
