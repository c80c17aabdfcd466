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

// relu_bwd alone (autograd's use is covered by relu's gradient above) and with the gradient sum
// ops::FuseActivationBackward folds into it: dx = acc + (y > 0 ? dy : 0), native only (oneDNN's
// eltwise backward declines an addend).
static const std::vector<OpCase> kBwdCases = {
    OpCase().shapes({{4, 9}, {4, 9}}),
    OpCase().shapes({{2, 3, 5, 5}, {2, 3, 5, 5}, {2, 3, 5, 5}}),
};
static const std::vector<BadCase> kBwdBad = {
    {{{4, 9}, {4, 9}, {4, 8}}, {}, {}, "input 2 has shape [4,8], expected the shape of input 0"},
    {{{4, 9}, {4, 9}, {4, 9}}, {DType::F32, DType::F32, DType::I32}, {}, "input 2 must be f32"},
};
MINIDL_OP_TEST(relu_bwd, kBwdCases, kBwdBad)
