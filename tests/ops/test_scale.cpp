#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 5}}).attrs({{"alpha", -2.5}}),
};
static const std::vector<BadCase> kBad = {
    {{{4, 5}}, {}, {}, "missing required attribute 'alpha'"},
    {{{4, 5}}, {}, {{"alpha", std::string("x")}}, "attribute 'alpha' must be float"},
    {{{4, 5}}, {}, {{"alpha", 1.0}, {"beta", 1.0}}, "unknown attribute 'beta'"},
};
MINIDL_OP_TEST(scale, kCases, kBad)
