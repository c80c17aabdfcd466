// The verifier: checks that a graph is well formed after every pass.
#pragma once

#include "minidl/ir/graph.hpp"

namespace minidl::ir {

/// Throws minidl::Error naming the first node that breaks a rule: inputs defined before use,
/// use-lists consistent, attributes as declared, shapes and dtypes equal to what inference gives
/// now, and every in-place write after all other reads of the value it overwrites.
void verify(const Graph& g);

}  // namespace minidl::ir
