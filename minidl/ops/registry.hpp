// The op table. Every op file under ops/ declares its op with MINIDL_OP(name); CMake scans those
// files and generates the table (minidl/ops/op_table.hpp), so no list is edited by hand and no
// static initializer can be dropped by the linker (the table references every op). A layer above
// that defines ops the same way (parallel's collectives) has a generated table of its own and adds
// it with register_op, since ops may not refer to a layer above it.
#pragma once

#include <string_view>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/ir/op_def.hpp"

namespace minidl::ops {

/// The op called name; throws minidl::Error listing the known ops when there is none.
const ir::OpDef& op(std::string_view name);
/// The op called name, or null.
const ir::OpDef* find_op(std::string_view name);
/// Every op: the generated table of ops/ first, then those added with register_op.
std::vector<const ir::OpDef*> all_ops();
/// Adds an op defined outside ops/ (a custom layer in an application, see
/// docs/adding-a-layer.md, or an op of a layer above, see parallel::register_ops): define it
/// with MINIDL_OP in any namespace, then register it (and its backward op) before the first
/// lookup by name. def must outlive its use, as a MINIDL_OP object
/// does. Fails when the name is taken, or the op lacks a shape rule, a native kernel (every op
/// but sources and aliases has one: the fallback of every backend) or a gradient rule (.grad, or
/// .no_grad("why")).
void register_op(const ir::OpDef& def);

/// Adds a node of op `name` to the inputs' graph and returns it.
ir::Node* apply_node(std::string_view name, std::vector<ir::Value*> inputs, ir::Attrs attrs = {},
                     std::string node_name = {});
/// Same, returning output `output` of the new node.
ir::Value* apply(std::string_view name, std::vector<ir::Value*> inputs, ir::Attrs attrs = {},
                 int output = 0);

}  // namespace minidl::ops

/// Defines op `name` as the object op_<name> in the enclosing namespace:
/// MINIDL_OP(relu).inputs({"x"}).infer(...)...; Under ops/ that is minidl::ops, and the line
/// enters the generated op table (which also declares op_relu for every file that includes
/// minidl/ops/op_table.hpp); elsewhere, pass op_<name> to register_op.
#define MINIDL_OP(name)                       \
  extern const ::minidl::ir::OpDef op_##name; \
  const ::minidl::ir::OpDef op_##name = ::minidl::ir::OpDef(#name)
