#include "minidl/parallel/layout.hpp"

#include <algorithm>

#include "minidl/core/error.hpp"
#include "minidl/parallel/reduction_tree.hpp"

namespace minidl::parallel {
namespace {

// The most micro-shards one rank's graph may hold in a micro-step: each is a copy of the
// forward and backward graph, compiled and planned one by one.
constexpr std::int64_t kMaxReplicas = 1024;

}  // namespace

Layout::Layout(LayoutOptions options) : options_(options) {
  MINIDL_CHECK(options.ranks >= 1, "layout: ranks must be at least 1, got ", options.ranks);
  MINIDL_CHECK(options.replicas >= 1, "layout: thread replicas must be at least 1, got ",
               options.replicas);
  MINIDL_CHECK(options.micro_batch >= 0, "layout: micro-batch must be positive (or 0: off), got ",
               options.micro_batch);
  MINIDL_CHECK(options.accumulate >= 1, "layout: accumulate must be at least 1, got ",
               options.accumulate);
  MINIDL_CHECK(options.stages == 1, "layout: ", options.stages,
               " pipeline stages: the layout holds one; pipeline stages are given by "
               "train::StepOptions::pipeline");
  MINIDL_CHECK(options.shards >= 1, "layout: tensor-parallel shards must be at least 1, got ",
               options.shards);
}

std::int64_t Layout::micro_shards(std::int64_t n) const {
  return (n + options_.micro_batch - 1) / options_.micro_batch;
}

namespace {

// The micro-steps of deterministic accumulation: nodes [lo, lo + m) of the reduction tree over
// the leaves, split while larger than `most` leaves and both children hold `least`. Each node
// found calls leaf(lo, m); each join of two children calls join() after its right child's.
template <typename Leaf, typename Join>
void split_tree(std::int64_t lo, std::int64_t m, std::int64_t most, std::int64_t least, Leaf&& leaf,
                Join&& join) {
  const std::int64_t left = tree_left(m);
  if (m <= most || m - left < least) {
    leaf(lo, m);
    return;
  }
  split_tree(lo, left, most, least, leaf, join);
  split_tree(lo + left, m - left, most, least, leaf, join);
  join();
}

}  // namespace

std::vector<Slice> Layout::micro_steps(std::int64_t n) const {
  check_batch(n, "a batch");
  const std::int64_t k = options_.accumulate;
  std::vector<Slice> steps;
  if (deterministic()) {
    const std::int64_t leaves = micro_shards(n), mb = options_.micro_batch;
    split_tree(
        0, leaves, (leaves + k - 1) / k, ranks(),
        [&](std::int64_t lo, std::int64_t m) {
          steps.push_back({lo * mb, std::min((lo + m) * mb, n)});
        },
        [] {});
    return steps;
  }
  const std::int64_t parts = std::max<std::int64_t>(1, std::min(k, n / ranks()));
  for (std::int64_t i = 0; i < parts; ++i) steps.push_back({n * i / parts, n * (i + 1) / parts});
  return steps;
}

std::vector<int> Layout::micro_step_joins(std::int64_t n) const {
  const std::size_t steps = micro_steps(n).size();
  std::vector<int> joins(steps, 1);
  joins[0] = 0;
  if (!deterministic()) return joins;
  std::fill(joins.begin(), joins.end(), 0);
  const std::int64_t leaves = micro_shards(n), k = options_.accumulate;
  std::size_t done = 0;  // micro-steps visited so far
  split_tree(
      0, leaves, (leaves + k - 1) / k, ranks(), [&](std::int64_t, std::int64_t) { ++done; },
      [&] { ++joins[done - 1]; });
  return joins;
}

Slice Layout::share(int rank, std::int64_t n) const {
  if (deterministic()) {
    const auto [lo, hi] = tree_owners(micro_shards(n), ranks())[static_cast<std::size_t>(rank)];
    return {lo * options_.micro_batch, std::min(hi * options_.micro_batch, n)};
  }
  const std::int64_t p = ranks(), r = rank;
  const std::int64_t base = n / p, extra = n % p;
  const std::int64_t begin = r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

std::vector<Slice> Layout::replicas(std::int64_t local, bool train) const {
  std::vector<Slice> slices;
  if (!train) return {{0, local}};
  if (deterministic()) {
    for (std::int64_t b = 0; b < local; b += options_.micro_batch)
      slices.push_back({b, std::min(b + options_.micro_batch, local)});
    return slices;
  }
  const std::int64_t r = std::min<std::int64_t>(options_.replicas, local);
  for (std::int64_t i = 0; i < r; ++i) slices.push_back({local * i / r, local * (i + 1) / r});
  return slices;
}

bool Layout::sections(std::int64_t local, bool train) const {
  return train && (deterministic() || replicas(local, train).size() > 1);
}

void Layout::check_batch(std::int64_t n, const std::string& what) const {
  if (deterministic()) {
    MINIDL_CHECK(micro_shards(n) >= ranks(), "deterministic mode: ", what, " of ", n,
                 " samples holds ", micro_shards(n), " micro-shard(s) of ", options_.micro_batch,
                 ", fewer than the ", ranks(),
                 " ranks: use a smaller --micro-batch or fewer ranks");
    // The most micro-shards a rank holds in one micro-step (accumulation splits its subtree).
    std::int64_t most = 0;
    for (const auto& [lo, hi] : tree_owners(micro_shards(n), ranks()))
      most = std::max(most, hi - lo);
    most = (most + accumulate() - 1) / accumulate();
    MINIDL_CHECK(most <= kMaxReplicas, "deterministic mode: ", what, " of ", n, " samples gives ",
                 most, " micro-shard(s) per rank, more than the ", kMaxReplicas,
                 " a rank's graph may hold: use a larger --micro-batch, a smaller --batch-size or "
                 "more ranks");
    return;
  }
  MINIDL_CHECK(n >= ranks(), what, " of ", n, " samples is smaller than the number of ranks, ",
               ranks(), ": every rank needs at least one sample of each batch");
}

std::string Layout::describe() const {
  const std::string steps =
      accumulate() > 1 ? fmt::format("{} micro-step(s) x ", accumulate()) : "";
  const std::string shards =
      options_.shards > 1 ? fmt::format(" x {} tensor-parallel shard(s)", options_.shards) : "";
  if (deterministic())
    return fmt::format("{}{} rank(s){}, deterministic: micro-batch {}", steps, ranks(), shards,
                       micro_batch());
  return fmt::format("{}{} rank(s){} x {} replica(s)", steps, ranks(), shards, options_.replicas);
}

}  // namespace minidl::parallel
