#include <string>

#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 5}, {4, 5}}),
    OpCase().shapes({{3, 2, 2, 7}, {3, 2, 2, 7}}),
    OpCase().shapes({{4, 5}, {5}}),                 // a bias over the last dimension
    OpCase().shapes({{4, 1}, {1, 5}}),              // both stretched
    OpCase().shapes({{2, 3, 4, 5}, {1, 3, 1, 1}}),  // per channel
    OpCase().shapes({{3}, {2, 1, 3}}),              // a has the lower rank
    OpCase().shapes({{}, {3, 2}}),                  // a scalar
    OpCase().shapes({{1}, {}}),
    // A residual sum with its ReLU fused (ops::FuseBiasActivation); the gradient goes through
    // relu_bwd of the output. Inputs kept away from 0 so that few sums sit at the kink.
    OpCase().shapes({{2, 3, 4, 5}, {2, 3, 4, 5}}).attrs({{"activation", std::string("relu")}}),
    OpCase().shapes({{4, 5}, {5}}).attrs({{"activation", std::string("relu")}}),
};
static const std::vector<BadCase> kBad = {
    {{{4, 5}, {5, 4}}, {}, {}, "cannot broadcast [4,5] with [5,4]"},
    {{{2, 3}, {2}}, {}, {}, "cannot broadcast [2,3] with [2]"},
    {{{2}, {2}}, {minidl::DType::F32, minidl::DType::I32}, {}, "input 1 must be f32"},
    {{{2}, {2}},
     {},
     {{"activation", std::string("gelu")}},
     "unknown activation 'gelu' (expected none or relu)"},
};
MINIDL_OP_TEST(add, kCases, kBad)
