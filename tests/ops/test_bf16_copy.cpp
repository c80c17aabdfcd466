#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

// An f32 copy here (nothing stores it as bf16): exact, its gradient passed through. The bf16
// copies the mixed-precision pass makes are tested in test_precision.cpp.
static const std::vector<OpCase> kCases = {OpCase().shapes({{4, 5}}), OpCase().shapes({{3}})};
static const std::vector<BadCase> kBad = {{{{3}}, {minidl::DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(bf16_copy, kCases, kBad)
