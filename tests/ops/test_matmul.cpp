#include "harness.hpp"

using minidl::DType;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kMatmulCases = {
    OpCase().shapes({{3, 4}, {4, 5}}),
    OpCase().shapes({{7, 13}, {13, 5}}),
    OpCase().shapes({{6, 9}, {11, 9}}).attrs({{"trans_b", true}}),
    OpCase().shapes({{9, 6}, {9, 11}}).attrs({{"trans_a", true}}),
    OpCase().shapes({{9, 6}, {11, 9}}).attrs({{"trans_a", true}, {"trans_b", true}}),
    OpCase().shapes({{1, 1}, {1, 1}}),
    OpCase().shapes({{33, 65}, {17, 65}}).attrs({{"trans_b", true}}),
    // Fused forms, as the fusion pass makes them: bias, bias + ReLU, ReLU alone.
    OpCase().shapes({{5, 7}, {7, 6}, {6}}),
    OpCase().shapes({{6, 9}, {11, 9}, {11}}).attrs({{"trans_b", true}, {"activation", "relu"}}),
    OpCase().shapes({{9, 6}, {9, 11}}).attrs({{"trans_a", true}, {"activation", "relu"}}),
    OpCase().shapes({{64, 40}, {33, 40}, {33}}).attrs({{"trans_b", true}, {"activation", "relu"}}),
};
static const std::vector<BadCase> kMatmulBad = {
    {{{3, 4}, {5, 6}}, {}, {}, "inner dimensions differ: 4 vs 5"},
    {{{2, 3, 4}, {4, 5}}, {}, {}, "expected 2-D operands"},
    {{{3, 4}, {4, 5}}, {DType::F32, DType::I32}, {}, "expected f32 operands"},
    {{{3, 4}, {4, 5}, {4}}, {}, {}, "bias must be [5] to match the output"},
    {{{3, 4}, {4, 5}},
     {},
     {{"activation", "gelu"}},
     "unknown activation 'gelu' (expected none or relu)"},
    {{{3, 4}, {4, 5}, {5}}, {DType::F32, DType::F32, DType::I32}, {}, "expected an f32 bias"},
};
MINIDL_OP_TEST(matmul, kMatmulCases, kMatmulBad)
