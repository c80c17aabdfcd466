#include "harness.hpp"

using minidl::DType;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 9}}).avoid_kinks(),
    OpCase().shapes({{2, 3, 5, 5}}).avoid_kinks(),
    OpCase().shapes({{1}}).avoid_kinks(),
};
static const std::vector<BadCase> kBad = {
    {{{4, 9}}, {DType::I32}, {}, "expected f32 input"},
};
MINIDL_OP_TEST(relu, kCases, kBad)
