// The fixed reduction tree of deterministic training. A global batch is cut into M micro-shards
// (the leaves, in sample order); their gradients are summed in one binary tree whose shape
// depends on M alone: a node over n leaves has a left child over (n + 1) / 2 of them and a right
// child over the rest. Workers (ranks, then the threads of a rank) own whole subtrees, so each
// computes its part of the same tree, and the combination of the parts continues it. Float
// addition is commutative, so every worker that evaluates a node gets the same bits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace minidl::parallel {

/// Leaves in the left child of a tree node over n leaves (n >= 2).
constexpr std::int64_t tree_left(std::int64_t n) { return (n + 1) / 2; }

/// The subtrees owned by `workers` workers in the tree over `leaves` leaves: worker w owns the
/// contiguous leaves [first, second) of entry w, each range one node of the tree. The workers of
/// a node are split between its children in proportion to their leaves (every worker owns at
/// least one leaf), so for a power of two that divides the leaves the ranges are equal.
/// Throws minidl::Error when workers < 1 or leaves < workers.
std::vector<std::pair<std::int64_t, std::int64_t>> tree_owners(std::int64_t leaves, int workers);

/// Visits the internal nodes that join the workers' subtrees, children before parents: for each
/// node, fn(a, b) where a is the first worker of the node's left part and b the first worker of
/// its right part (the result of the node is then held at a's place). Same tree as tree_owners.
template <typename Fn>
void tree_combine_order(std::int64_t leaves, int workers, Fn&& fn);

// ---- implementation ------------------------------------------------------------------------

/// Workers given to the left child of a node over n leaves shared by w >= 2 workers.
int tree_left_workers(std::int64_t n, int w);

namespace detail {
template <typename Fn>
void combine(std::int64_t n, int first, int w, Fn& fn) {
  if (w == 1) return;
  const int wl = tree_left_workers(n, w);
  combine(tree_left(n), first, wl, fn);
  combine(n - tree_left(n), first + wl, w - wl, fn);
  fn(first, first + wl);
}
}  // namespace detail

template <typename Fn>
void tree_combine_order(std::int64_t leaves, int workers, Fn&& fn) {
  detail::combine(leaves, 0, workers, fn);
}

}  // namespace minidl::parallel
