// One replica on one rank: the sum is the value itself. The lowering over replicas and ranks
// is tested in tests/parallel (CrossReplicaSums.*) and under mpirun.
#include "harness.hpp"

using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kCases = {
    OpCase().shapes({{3, 4}}).attrs({{"key", std::string("bn.stats")}}),
    OpCase().shapes({{5}}).attrs({{"key", std::string("k")}}),
};
static const std::vector<BadCase> kBad = {
    {{{3}}, {}, {}, "missing required attribute 'key'"},
    {{{3}}, {}, {{"key", std::string()}}, "the attribute 'key' must name the sum"},
    {{{3}}, {minidl::DType::I32}, {{"key", std::string("k")}}, "expected f32 input"},
};
MINIDL_OP_TEST(cross_replica_sum, kCases, kBad)
