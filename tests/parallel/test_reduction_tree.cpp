// The fixed reduction tree of deterministic training: which subtrees the workers own, and that
// joining the workers' partial sums in tree_combine_order gives the bits of the whole tree
// evaluated by one worker, for every split of the leaves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "../support/error_of.hpp"
#include "minidl/parallel/reduction_tree.hpp"

using namespace minidl;
using minidl::testing::error_of;
using parallel::tree_combine_order;
using parallel::tree_left;
using parallel::tree_owners;

namespace {

using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

// The tree over leaves [lo, lo + n), as one worker evaluates it.
float tree_sum(const std::vector<float>& x, std::int64_t lo, std::int64_t n) {
  if (n == 1) return x[static_cast<std::size_t>(lo)];
  return tree_sum(x, lo, tree_left(n)) + tree_sum(x, lo + tree_left(n), n - tree_left(n));
}

std::uint32_t bits(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST(ReductionTree, PowersOfTwoSplitEqually) {
  EXPECT_EQ(tree_owners(8, 1), (Ranges{{0, 8}}));
  EXPECT_EQ(tree_owners(8, 2), (Ranges{{0, 4}, {4, 8}}));
  EXPECT_EQ(tree_owners(8, 4), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(tree_owners(4, 4), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
}

TEST(ReductionTree, OtherCountsOwnWholeSubtrees) {
  // 8 leaves, 3 workers: the left half goes to two of them, the right half to the third.
  EXPECT_EQ(tree_owners(8, 3), (Ranges{{0, 2}, {2, 4}, {4, 8}}));
  // 6 leaves (a ragged last batch), 4 workers: subtrees of 2, 1, 2 and 1 leaves.
  EXPECT_EQ(tree_owners(6, 4), (Ranges{{0, 2}, {2, 3}, {3, 5}, {5, 6}}));
  EXPECT_EQ(tree_owners(5, 5), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}}));
}

TEST(ReductionTree, EveryLeafHasOneOwner) {
  for (std::int64_t leaves = 1; leaves <= 40; ++leaves) {
    for (int workers = 1; workers <= leaves; ++workers) {
      const Ranges r = tree_owners(leaves, workers);
      ASSERT_EQ(r.size(), static_cast<std::size_t>(workers));
      std::int64_t next = 0;
      for (const auto& [lo, hi] : r) {
        EXPECT_EQ(lo, next) << leaves << " leaves, " << workers << " workers";
        EXPECT_LT(lo, hi) << leaves << " leaves, " << workers << " workers";
        next = hi;
      }
      EXPECT_EQ(next, leaves);
    }
  }
}

TEST(ReductionTree, JoiningTheWorkersPartsGivesTheWholeTreesBits) {
  std::mt19937 gen(7);
  // Magnitudes spread over many binades, so that another order of the additions would round
  // differently (checked below: the plain left-to-right sum differs for some sizes).
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  int order_mattered = 0;
  for (std::int64_t leaves = 1; leaves <= 33; ++leaves) {
    std::vector<float> x(static_cast<std::size_t>(leaves));
    for (float& v : x) v = std::ldexp(mantissa(gen), exponent(gen));
    const float whole = tree_sum(x, 0, leaves);
    float sequential = 0.0f;
    for (float v : x) sequential += v;
    order_mattered += bits(sequential) != bits(whole);
    for (int workers = 1; workers <= leaves; ++workers) {
      std::vector<float> part;
      for (const auto& [lo, hi] : tree_owners(leaves, workers))
        part.push_back(tree_sum(x, lo, hi - lo));
      tree_combine_order(leaves, workers, [&](int a, int b) {
        part[static_cast<std::size_t>(a)] += part[static_cast<std::size_t>(b)];
      });
      EXPECT_EQ(bits(part[0]), bits(whole)) << leaves << " leaves, " << workers << " workers";
    }
  }
  EXPECT_GT(order_mattered, 5) << "the data does not tell summation orders apart";
}

TEST(ReductionTree, RefusesMoreWorkersThanLeaves) {
  EXPECT_NE(error_of([] { tree_owners(3, 4); }).find("over 3 micro-shard(s) cannot give each of 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { tree_owners(3, 0); }).find("at least one worker"), std::string::npos);
}
