#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 5}}).attrs({{"exponent", 2.0}}),
    OpCase().shapes({{4, 5}}).attrs({{"exponent", 3.0}}),
    OpCase().shapes({{4, 5}}).attrs({{"exponent", 0.5}}).positive(),
    OpCase().shapes({{4, 5}}).attrs({{"exponent", -1.5}}).positive(0.5),
    OpCase().shapes({{3}}).attrs({{"exponent", 1.0}}),
    OpCase().shapes({{3}}).attrs({{"exponent", 0.0}}),
};
static const std::vector<BadCase> kBad = {
    {{{3}}, {}, {}, "missing required attribute 'exponent'"},
    {{{3}}, {minidl::DType::I32}, {{"exponent", 2.0}}, "expected f32 input"},
};
MINIDL_OP_TEST(pow, kCases, kBad)
