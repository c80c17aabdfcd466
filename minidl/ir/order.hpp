// Execution orders for scheduling passes: a graph's node order is its execution order, and
// passes that place nodes (thread replicas, pipeline stages) choose among the valid orders by a
// priority.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::ir {

/// The nodes of g in an order that keeps every dependence — a node after the producers of its
/// inputs, an in-place write after the other readers of the value it overwrites, and `from`
/// before `to` for each pair of `extra` — taking, among the nodes that may run, the one with the
/// smallest key, then the earliest in the current order (so a valid order whose keys already
/// rise is kept). Throws naming `what` if the dependences form a cycle.
std::vector<Node*> ordered_by(const Graph& g, const std::function<std::int64_t(const Node*)>& key,
                              const std::vector<std::pair<const Node*, const Node*>>& extra,
                              std::string_view what);

}  // namespace minidl::ir
