#include <cmath>

#include "harness.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {
// stats [3,C] of some batch: a count, any sum, and a sum of squares above sum^2 / n (a positive
// variance, away from the clamp).
void consistent_stats(std::size_t, Tensor& t) {
  const std::int64_t ch = t.shape()[1];
  float* p = t.data<float>();
  for (std::int64_t c = 0; c < ch; ++c) {
    const float n = 6.0f + static_cast<float>(c);
    const float s = 3.0f * p[ch + c];
    p[c] = n;
    p[ch + c] = s;
    p[2 * ch + c] = s * s / n + n * (0.5f + std::fabs(p[2 * ch + c]));
  }
}
}  // namespace

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{3, 4}}).prepared(consistent_stats),
    OpCase().shapes({{3, 1}}).prepared(consistent_stats),
    OpCase().shapes({{3, 5}}).prepared(consistent_stats).loss_outputs({0}),  // dvar absent
    OpCase().shapes({{3, 5}}).prepared(consistent_stats).loss_outputs({1}),  // dmean absent
};
static const std::vector<BadCase> kBad = {
    {{{2, 4}}, {}, {}, "expected stats [3,C], got [2,4]"},
    {{{12}}, {}, {}, "expected stats [3,C], got [12]"},
    {{{3, 4}}, {DType::I32}, {}, "expected f32 stats"},
};
MINIDL_OP_TEST(bn_moments, kCases, kBad)

static const std::vector<BadCase> kBwdBad = {
    {{{3, 4}, {4}, {5}}, {}, {}, "input 2 (dvar) must be f32 [4] to match stats"},
    {{{3, 4}, {3}, {4}}, {}, {}, "input 1 (dmean) must be f32 [4]"},
};
MINIDL_OP_TEST(bn_moments_bwd, std::vector<OpCase>{}, kBwdBad)
