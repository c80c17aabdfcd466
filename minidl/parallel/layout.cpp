#include "minidl/parallel/layout.hpp"

#include <algorithm>

#include "minidl/core/error.hpp"
#include "minidl/parallel/reduction_tree.hpp"

namespace minidl::parallel {

Layout::Layout(LayoutOptions options) : options_(options) {
  MINIDL_CHECK(options.ranks >= 1, "layout: ranks must be at least 1, got ", options.ranks);
  MINIDL_CHECK(options.replicas >= 1, "layout: thread replicas must be at least 1, got ",
               options.replicas);
  MINIDL_CHECK(options.micro_batch >= 0, "layout: micro-batch must be positive (or 0: off), got ",
               options.micro_batch);
  MINIDL_CHECK(options.stages == 1 && options.shards == 1, "layout: ", options.stages,
               " pipeline stage(s) x ", options.shards,
               " tensor shard(s) are not implemented (only one stage and one shard: every rank "
               "holds the whole model)");
}

std::int64_t Layout::micro_shards(std::int64_t n) const {
  return (n + options_.micro_batch - 1) / options_.micro_batch;
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
    return;
  }
  MINIDL_CHECK(n >= ranks(), what, " of ", n, " samples is smaller than the number of ranks, ",
               ranks(), ": every rank needs at least one sample of each batch");
}

std::string Layout::describe() const {
  if (deterministic())
    return fmt::format("{} rank(s), deterministic: micro-batch {}", ranks(), micro_batch());
  return fmt::format("{} rank(s) x {} replica(s)", ranks(), options_.replicas);
}

}  // namespace minidl::parallel
