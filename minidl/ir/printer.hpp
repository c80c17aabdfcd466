// Readable dumps of a graph: text (one line per node) and Graphviz DOT.
#pragma once

#include <string>

#include "minidl/ir/graph.hpp"

namespace minidl::ir {

/// One line per node: "%5 = matmul(%1, %3) trans_b=true -> [64,256] f32  # fc1.matmul [backward]".
std::string to_text(const Graph& g);
/// Graphviz DOT; forward, backward and update nodes are coloured differently.
std::string to_dot(const Graph& g);

}  // namespace minidl::ir
