// ZeRO in a single process: the plan's shards (near-equal, at norm-chunk boundaries, uneven for
// 3 ranks), the ops' shape rules and refusals through the op harness, and the squared norm from
// shards against sum_squares. The multi-rank bits are checked by tests/examples/zero.sh.
#include <gmock/gmock.h>

#include "minidl/ops/common.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/op_table.hpp"
#include "minidl/parallel/zero.hpp"
#include "minidl/runtime/executable.hpp"
#include "ops/harness.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {
class RegisterCollectives final : public ::testing::Environment {
 public:
  void SetUp() override { parallel::register_ops(); }
};
::testing::Environment* const kRegister =
    ::testing::AddGlobalTestEnvironment(new RegisterCollectives);
}  // namespace

static const std::vector<OpCase> kReduceScatter = {
    OpCase().shapes({{12}}).attrs({{"bounds", ir::Ints{0, 12}}, {"rank", 0}}),
    OpCase().shapes({{12}}).attrs({{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"leaves", 3}}),
};
static const std::vector<BadCase> kReduceScatterBad = {
    {{{12}},
     {},
     {{"bounds", ir::Ints{0, 10}}, {"rank", 0}},
     "the bucket has 12 elements, the shards 10"},
    {{{3, 4}}, {}, {{"bounds", ir::Ints{0, 12}}, {"rank", 0}}, "expected a flat f32 bucket"},
    {{{12}}, {}, {{"bounds", ir::Ints{0, 6, 6, 12}}, {"rank", 0}}, "shard 1 of bounds"},
    {{{12}}, {}, {{"bounds", ir::Ints{0, 12}}, {"rank", 1}}, "rank 1 outside the 1 shards"},
};
MINIDL_OP_TEST(reduce_scatter, kReduceScatter, kReduceScatterBad)

static const std::vector<OpCase> kAllgatherv = {
    OpCase().shapes({{7}}).attrs({{"bounds", ir::Ints{0, 7}}, {"rank", 0}}),
};
static const std::vector<BadCase> kAllgathervBad = {
    {{{6}}, {}, {{"bounds", ir::Ints{0, 7}}, {"rank", 0}}, "expected this rank's f32 shard [7]"},
};
MINIDL_OP_TEST(allgatherv, kAllgatherv, kAllgathervBad)

static const std::vector<OpCase> kShardSumSquares = {
    OpCase().shapes({{9}}).attrs({{"bounds", ir::Ints{0, 9}},
                                  {"rank", 0},
                                  {"offsets", ir::Ints{0, 4, 9}},
                                  {"order", ir::Ints{1, 0}}}),
};
static const std::vector<BadCase> kShardSumSquaresBad = {
    {{{9}},
     {},
     {{"bounds", ir::Ints{0, 9}},
      {"rank", 0},
      {"offsets", ir::Ints{0, 4, 9}},
      {"order", ir::Ints{0, 0}}},
     "is not an order of the 2 parameters"},
    {{{9}},
     {},
     {{"bounds", ir::Ints{0, 9}},
      {"rank", 0},
      {"offsets", ir::Ints{0, 4, 8}},
      {"order", ir::Ints{0, 1}}},
     "do not cover the 9 elements"},
};
MINIDL_OP_TEST(shard_sum_squares, kShardSumSquares, kShardSumSquaresBad)

static const std::vector<OpCase> kScatterInto = {
    OpCase()
        .shapes({{12}, {2, 3}})
        .attrs({{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 5}}),
    OpCase()
        .shapes({{12}, {4}})
        .attrs({{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 0}, {"leaves", 2}}),
};
static const std::vector<BadCase> kScatterIntoBad = {
    {{{12}, {2, 4}},
     {},
     {{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 5}},
     "offset 5 + 8 elements exceeds the shards' 12"},
    {{{10}, {4}},
     {},
     {{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 0}},
     "expected this rank's f32 shard [12] and an f32 tensor"},
};
MINIDL_OP_TEST(zero_scatter_into, kScatterInto, kScatterIntoBad)

static const std::vector<OpCase> kAllreduceInto = {
    OpCase()
        .shapes({{12}, {2, 3}})
        .attrs({{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 5}}),
    OpCase()
        .shapes({{12}, {4}})
        .attrs({{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 8}, {"leaves", 2}}),
};
static const std::vector<BadCase> kAllreduceIntoBad = {
    {{{12}, {2, 4}},
     {},
     {{"bounds", ir::Ints{0, 12}}, {"rank", 0}, {"offset", 5}},
     "offset 5 + 8 elements exceeds the shards' 12"},
};
MINIDL_OP_TEST(zero_allreduce_into, kAllreduceInto, kAllreduceIntoBad)

static const std::vector<OpCase> kGatherInto = {
    OpCase().shapes({{2, 3}, {9}}).attrs({{"bounds", ir::Ints{0, 9}}, {"rank", 0}, {"offset", 3}}),
};
static const std::vector<BadCase> kGatherIntoBad = {
    {{{2, 3}, {9}},
     {},
     {{"bounds", ir::Ints{0, 9}}, {"rank", 0}, {"offset", 4}},
     "offset 4 + 6 elements exceeds the shards' 9"},
    {{{2, 3}, {8}},
     {},
     {{"bounds", ir::Ints{0, 9}}, {"rank", 0}, {"offset", 0}},
     "expected an f32 parameter and this rank's f32 shard [9]"},
};
MINIDL_OP_TEST(zero_gather_into, kGatherInto, kGatherIntoBad)

// One rank: zero_scatter_into writes the gradient at its offset in the shard, zero_gather_into
// reads the parameter back from there.
TEST(Zero, ScatterAndGatherIntoPlaceOnOneRank) {
  ir::Graph g;
  Tensor shard = Tensor::zeros({9}), grad = Tensor::empty({2, 2}), param = Tensor::zeros({2, 2});
  for (std::int64_t i = 0; i < 4; ++i) grad.data<float>()[i] = 1.5f + static_cast<float>(i);
  const ir::Ints bounds{0, 9};
  ir::Value* s = ops::parameter(g, "shard", shard);
  ir::Value* filled =
      g.add_node(parallel::op_zero_scatter_into, {s, ops::parameter(g, "g", grad)},
                 {{"bounds", bounds}, {"rank", std::int64_t{0}}, {"offset", std::int64_t{3}}})
          ->output();
  ir::Value* back =
      g.add_node(parallel::op_zero_gather_into, {ops::parameter(g, "p", param), filled},
                 {{"bounds", bounds}, {"rank", std::int64_t{0}}, {"offset", std::int64_t{3}}})
          ->output();
  g.add_output(back);
  runtime::Executable exe(g);
  exe.run();
  for (std::int64_t i = 0; i < 9; ++i)
    EXPECT_EQ(shard.at(i), i >= 3 && i < 7 ? 1.5f + static_cast<float>(i - 3) : 0.0f) << i;
  for (std::int64_t i = 0; i < 4; ++i) EXPECT_EQ(param.at(i), grad.at(i)) << i;
}

static const std::vector<OpCase> kAssignSlice = {
    OpCase().shapes({{2, 3}, {10}}).attrs({{"offset", 4}}),
};
static const std::vector<BadCase> kAssignSliceBad = {
    {{{2, 3}, {10}}, {}, {{"offset", 5}}, "offset 5 + 6 elements exceeds the source's 10"},
    {{{2, 3}, {2, 5}}, {}, {{"offset", 0}}, "expected an f32 destination and a flat f32 source"},
};
MINIDL_OP_TEST(assign_slice, kAssignSlice, kAssignSliceBad)

namespace {
std::vector<std::pair<std::string, Shape>> model_shapes() {
  // 100000 elements (25 chunks of 4096, the last shorter), a small bias, 20000 (5 chunks).
  return {{"fc1.weight", Shape{100, 1000}}, {"fc1.bias", Shape{100}}, {"fc2.weight", Shape{20000}}};
}
}  // namespace

// Shards cover the flat space in order, are near-equal, and end at norm-chunk boundaries of the
// parameter they cut; 3 ranks give uneven shards.
TEST(ZeroPlan, ShardsAtChunkBoundaries) {
  for (int ranks : {1, 2, 3, 4, 7}) {
    const parallel::ZeroPlan p = parallel::ZeroPlan::make(model_shapes(), ranks);
    ASSERT_EQ(p.ranks(), ranks);
    EXPECT_EQ(p.total(), 120100);
    EXPECT_EQ(p.bounds.front(), 0);
    EXPECT_EQ(p.bounds.back(), p.total());
    for (int r = 0; r < ranks; ++r) {
      EXPECT_GT(p.shard_size(r), 0) << ranks << " ranks, rank " << r;
      // Near-equal: within one chunk of an equal split.
      EXPECT_LE(std::abs(p.shard_size(r) - p.total() / ranks), 2 * 4096) << ranks << " ranks";
      const std::int64_t end = p.bounds[r + 1];
      bool at_cut = false;
      for (std::size_t i = 0; i < p.names.size(); ++i) {
        const std::int64_t n = p.offsets[i + 1] - p.offsets[i];
        if (end > p.offsets[i] && end <= p.offsets[i + 1])
          at_cut = end == p.offsets[i + 1] || (end - p.offsets[i]) % ops::fixed_order_chunk(n) == 0;
      }
      EXPECT_TRUE(at_cut) << ranks << " ranks: shard " << r << " ends at " << end;
    }
    // The pieces of each parameter over the ranks tile it.
    for (std::size_t i = 0; i < p.names.size(); ++i) {
      std::int64_t covered = 0;
      for (int r = 0; r < ranks; ++r) covered += p.piece(i, r).size();
      EXPECT_EQ(covered, p.offsets[i + 1] - p.offsets[i]);
    }
  }
  const parallel::ZeroPlan three = parallel::ZeroPlan::make(model_shapes(), 3);
  EXPECT_NE(three.shard_size(0), three.shard_size(2));  // uneven: 40960, 40960, 38180
}

// A shard target that falls inside the first, large parameter still leaves every later rank a
// cut of its own: the small parameters after it.
TEST(ZeroPlan, EveryRankGetsAChunk) {
  const parallel::ZeroPlan p =
      parallel::ZeroPlan::make({{"w", Shape{800}}, {"b", Shape{10}}, {"c", Shape{5}}}, 3);
  EXPECT_EQ(p.bounds, (std::vector<std::int64_t>{0, 800, 810, 815}));
}

TEST(ZeroPlan, TooFewChunks) {
  EXPECT_THAT(
      [] {
        parallel::ZeroPlan::make({{"w", Shape{10}}, {"b", Shape{2}}}, 3);
      },
      ThrowsMessage<Error>(HasSubstr("form 2 norm chunk(s), too few to give each of 3")));
}

// The squared norm from the shard (one process: the whole flat space) equals sum_squares of each
// parameter, added in the given order, bit for bit.
TEST(ZeroOps, ShardSumSquaresIsSumSquares) {
  const auto shapes = model_shapes();
  const parallel::ZeroPlan plan = parallel::ZeroPlan::make(shapes, 1);
  Tensor flat = Tensor::empty(Shape{plan.total()});
  for (std::int64_t i = 0; i < plan.total(); ++i)
    flat.data<float>()[i] = 0.001f * static_cast<float>((i * 7919) % 1000) - 0.5f;
  std::vector<float> sums;
  for (std::size_t i = 0; i < plan.names.size(); ++i) {
    const float* x = flat.data<float>() + plan.offsets[i];
    sums.push_back(static_cast<float>(
        ops::fixed_order_sum(plan.offsets[i + 1] - plan.offsets[i],
                             [x](std::int64_t j) { return static_cast<double>(x[j]) * x[j]; })));
  }
  const float want = (sums[2] + sums[0]) + sums[1];
  ir::Graph g;
  parallel::ZeroPieces pieces;
  pieces.shard = ops::parameter(g, "grads", flat);
  ir::Value* total = parallel::zero_sum_squares(g, plan, {}, pieces, {2, 0, 1});
  g.add_output(total);
  runtime::Executable exe(g);
  exe.run();
  EXPECT_EQ(exe.value(total).at(0), want);
}
