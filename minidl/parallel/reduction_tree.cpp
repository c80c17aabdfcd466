#include "minidl/parallel/reduction_tree.hpp"

#include <algorithm>

#include "minidl/core/error.hpp"

namespace minidl::parallel {

int tree_left_workers(std::int64_t n, int w) {
  const std::int64_t left = tree_left(n), right = n - left;
  // In proportion to the leaves, rounded to nearest, but each side keeps at least one worker and
  // no more workers than leaves.
  std::int64_t wl = (static_cast<std::int64_t>(w) * left * 2 + n) / (2 * n);
  wl = std::clamp<std::int64_t>(wl, std::max<std::int64_t>(1, w - right),
                                std::min<std::int64_t>(left, w - 1));
  return static_cast<int>(wl);
}

namespace {
void assign(std::int64_t lo, std::int64_t n, int first, int w,
            std::vector<std::pair<std::int64_t, std::int64_t>>& out) {
  if (w == 1) {
    out[static_cast<std::size_t>(first)] = {lo, lo + n};
    return;
  }
  const int wl = tree_left_workers(n, w);
  assign(lo, tree_left(n), first, wl, out);
  assign(lo + tree_left(n), n - tree_left(n), first + wl, w - wl, out);
}
}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> tree_owners(std::int64_t leaves, int workers) {
  MINIDL_CHECK(workers >= 1, "a reduction tree needs at least one worker, got ", workers);
  MINIDL_CHECK(leaves >= workers, "a reduction tree over ", leaves, " micro-shard(s) cannot give ",
               "each of ", workers, " workers one");
  std::vector<std::pair<std::int64_t, std::int64_t>> out(static_cast<std::size_t>(workers));
  assign(0, leaves, 0, workers, out);
  return out;
}

}  // namespace minidl::parallel
