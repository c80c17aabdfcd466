#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {OpCase().shapes({{4, 5}}), OpCase().shapes({{}})};
static const std::vector<BadCase> kBad = {{{{3}}, {minidl::DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(exp, kCases, kBad)
