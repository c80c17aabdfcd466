#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kReshape = {
    OpCase().shapes({{2, 3, 4}}).attrs({{"shape", minidl::ir::Ints{6, 4}}}),
    OpCase().shapes({{2, 3, 4}}).attrs({{"shape", minidl::ir::Ints{-1, 2}}}),
};
static const std::vector<BadCase> kReshapeBad = {
    {{{2, 3, 4}}, {}, {{"shape", minidl::ir::Ints{5, 5}}}, "cannot reshape 24 elements to [5,5]"},
    {{{2, 3, 4}}, {}, {{"shape", minidl::ir::Ints{-1, -1}}}, "at most one dimension may be -1"},
};
MINIDL_OP_TEST(reshape, kReshape, kReshapeBad)

static const std::vector<OpCase> kFlatten = {
    OpCase().shapes({{2, 1, 28, 28}}),
    OpCase().shapes({{2, 3, 4}}).attrs({{"start_dim", std::int64_t{2}}}),
};
static const std::vector<BadCase> kFlattenBad = {
    {{{2, 3}}, {}, {{"start_dim", std::int64_t{5}}}, "start_dim 5 is out of range for rank 2"},
};
MINIDL_OP_TEST(flatten, kFlatten, kFlattenBad)
