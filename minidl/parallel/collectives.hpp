// Collective ops: ordinary IR ops (schema, shape rule, kernel, test) whose kernels call the
// communicator, so a graph dump shows exactly where and in which order gradients are reduced.
#pragma once

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

/// Adds the collective ops to the op table (once; later calls do nothing).
void register_collective_ops();

/// y = sum over the ranks of group `group` of (scale * x), written in place into x's buffer.
ir::Value* allreduce(ir::Value* x, double scale, int group = 0, const std::string& name = {});

}  // namespace minidl::parallel
