#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 5}, {4, 5}}),
    OpCase().shapes({{3, 2, 2, 7}, {3, 2, 2, 7}}),
};
static const std::vector<BadCase> kBad = {
    {{{4, 5}, {5, 4}}, {}, {}, "input 1 has shape [5,4], expected the shape of input 0, [4,5]"},
};
MINIDL_OP_TEST(add, kCases, kBad)
