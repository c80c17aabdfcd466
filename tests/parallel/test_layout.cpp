// The layout's batch mapping: rank shares, replica slices, and the micro-steps of gradient
// accumulation with the order their gradients are summed in.
#include <gtest/gtest.h>

#include "minidl/core/error.hpp"
#include "minidl/parallel/layout.hpp"

using namespace minidl;
using parallel::Layout;
using parallel::Slice;

namespace {
std::vector<std::pair<std::int64_t, std::int64_t>> pairs(const std::vector<Slice>& slices) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (const Slice& s : slices) out.emplace_back(s.begin, s.end);
  return out;
}
using Pairs = std::vector<std::pair<std::int64_t, std::int64_t>>;
}  // namespace

TEST(Layout, WithoutAccumulationOneMicroStepIsTheWholeBatch) {
  const Layout l({.ranks = 2});
  EXPECT_EQ(pairs(l.micro_steps(10)), (Pairs{{0, 10}}));
  EXPECT_EQ(l.micro_step_joins(10), std::vector<int>{0});
}

TEST(Layout, AccumulationSplitsNearEquallyAndSumsInArrivalOrder) {
  const Layout l({.ranks = 2, .accumulate = 3});
  EXPECT_EQ(pairs(l.micro_steps(12)), (Pairs{{0, 4}, {4, 8}, {8, 12}}));
  EXPECT_EQ(pairs(l.micro_steps(10)), (Pairs{{0, 3}, {3, 6}, {6, 10}}));
  EXPECT_EQ(l.micro_step_joins(12), (std::vector<int>{0, 1, 1}));
  // A short last batch gets fewer micro-steps, each still feeding both ranks.
  EXPECT_EQ(pairs(l.micro_steps(5)), (Pairs{{0, 2}, {2, 5}}));
  EXPECT_EQ(pairs(l.micro_steps(2)), (Pairs{{0, 2}}));
  EXPECT_THROW(l.micro_steps(1), Error);
}

TEST(Layout, DeterministicMicroStepsAreSubtreesSummedInTheTreeOrder) {
  // 64 samples in micro-shards of 8: the tree ((01)(23))((45)(67)); four micro-steps of two.
  const Layout l({.micro_batch = 8, .accumulate = 4});
  EXPECT_EQ(pairs(l.micro_steps(64)), (Pairs{{0, 16}, {16, 32}, {32, 48}, {48, 64}}));
  EXPECT_EQ(l.micro_step_joins(64), (std::vector<int>{0, 1, 0, 2}));
  // 40 samples, five leaves: ((01)2)(34); at most two leaves per micro-step.
  EXPECT_EQ(pairs(l.micro_steps(40)), (Pairs{{0, 16}, {16, 24}, {24, 40}}));
  EXPECT_EQ(l.micro_step_joins(40), (std::vector<int>{0, 1, 1}));
  // A ragged last micro-shard stays in the last micro-step.
  EXPECT_EQ(pairs(l.micro_steps(60)), (Pairs{{0, 16}, {16, 32}, {32, 48}, {48, 60}}));
}

TEST(Layout, DeterministicMicroStepsKeepAMicroShardForEveryRank) {
  // Two ranks: a node whose right child would hold one leaf is not split further.
  const Layout l({.ranks = 2, .micro_batch = 8, .accumulate = 4});
  EXPECT_EQ(pairs(l.micro_steps(64)), (Pairs{{0, 16}, {16, 32}, {32, 48}, {48, 64}}));
  EXPECT_EQ(pairs(l.micro_steps(40)), (Pairs{{0, 24}, {24, 40}}));
  EXPECT_EQ(l.micro_step_joins(40), (std::vector<int>{0, 1}));
  const Layout four({.ranks = 4, .micro_batch = 8, .accumulate = 4});
  EXPECT_EQ(pairs(four.micro_steps(64)), (Pairs{{0, 32}, {32, 64}}));
}

TEST(Layout, RefusesBadAccumulation) {
  EXPECT_THROW(Layout({.accumulate = 0}), Error);
  try {
    Layout({.accumulate = -2});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accumulate must be at least 1, got -2"),
              std::string::npos)
        << e.what();
  }
}

// Every rank needs a micro-shard of every micro-step: --batch-size 16 in micro-shards of 8 cannot
// feed four ranks, whatever the accumulation.
TEST(Layout, AMicroStepTooSmallForTheRanksIsNamed) {
  const Layout l({.ranks = 4, .micro_batch = 8, .accumulate = 4});
  try {
    l.check_batch(16, "a micro-step (--batch-size)");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a micro-step (--batch-size) of 16 samples holds 2 "
                                         "micro-shard(s) of 8, fewer than the 4 ranks"),
              std::string::npos)
        << e.what();
  }
}
