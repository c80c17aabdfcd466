#include <cmath>

#include "harness.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {
void positive_var(std::size_t i, Tensor& t) {
  if (i != 3) return;
  for (std::int64_t j = 0; j < t.numel(); ++j)
    t.data<float>()[j] = 0.2f + std::fabs(t.data<float>()[j]);
}
}  // namespace

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{4, 3, 3, 3}, {4}, {4}, {4}, {4}, {4}}).prepared(positive_var),
    OpCase().shapes({{2, 5, 1, 1}, {2}, {2}, {2}}).prepared(positive_var),
};
static const std::vector<BadCase> kBad = {
    {{{4, 3, 3, 3}, {4}, {4}, {3}}, {}, {}, "input 3 (var) must be [4], one per filter of w"},
    {{{4, 3}, {4}, {4}, {4}}, {}, {}, "expected w [K,C,KH,KW], got rank 2"},
};
MINIDL_OP_TEST(fold_batch_norm, kCases, kBad)
