#include "minidl/ops/registry.hpp"

#include <algorithm>
#include <mutex>

#include "minidl/ops/op_table.hpp"

namespace minidl::ops {
namespace {
std::mutex& extra_mutex() {
  static std::mutex m;
  return m;
}
std::vector<const ir::OpDef*>& extra_ops() {
  static std::vector<const ir::OpDef*> ops;
  return ops;
}
}  // namespace

std::vector<const ir::OpDef*> all_ops() {
  std::vector<const ir::OpDef*> all(op_table().begin(), op_table().end());
  std::lock_guard lock(extra_mutex());
  all.insert(all.end(), extra_ops().begin(), extra_ops().end());
  return all;
}

const ir::OpDef* find_op(std::string_view name) {
  for (const ir::OpDef* d : op_table())
    if (d->name() == name) return d;
  std::lock_guard lock(extra_mutex());
  for (const ir::OpDef* d : extra_ops())
    if (d->name() == name) return d;
  return nullptr;
}

const ir::OpDef& op(std::string_view name) {
  if (const ir::OpDef* d = find_op(name)) return *d;
  std::string known;
  for (const ir::OpDef* d : all_ops()) known += (known.empty() ? "" : ", ") + d->name();
  MINIDL_FAIL("unknown op '", name, "'; known ops: ", known);
}

void register_op(const ir::OpDef& def) {
  MINIDL_CHECK(find_op(def.name()) == nullptr, "op '", def.name(), "' is already registered");
  MINIDL_CHECK(def.infer_fn() != nullptr, "op '", def.name(), "' has no shape rule (.infer)");
  // Sources (inputs, parameters) and aliases (reshape) run no kernel.
  MINIDL_CHECK(
      def.is_source() || def.is_alias() ||
          std::any_of(def.kernels().begin(), def.kernels().end(),
                      [](const ir::KernelDef& k) { return k.backend == ir::Backend::Native; }),
      "op '", def.name(), "' has no native kernel (.kernel(ir::Backend::Native, ...))");
  MINIDL_CHECK(def.has_grad_rule(), "op '", def.name(),
               "' has no gradient rule (.grad(...), or .no_grad(\"why\"))");
  std::lock_guard lock(extra_mutex());
  extra_ops().push_back(&def);
}

ir::Node* apply_node(std::string_view name, std::vector<ir::Value*> inputs, ir::Attrs attrs,
                     std::string node_name) {
  MINIDL_CHECK(!inputs.empty() && inputs[0] != nullptr, "op '", name,
               "' applied without inputs; add source nodes through the graph");
  ir::Graph& g = inputs[0]->graph();
  return g.add_node(op(name), std::move(inputs), std::move(attrs), std::move(node_name));
}

ir::Value* apply(std::string_view name, std::vector<ir::Value*> inputs, ir::Attrs attrs,
                 int output) {
  return apply_node(name, std::move(inputs), std::move(attrs))->output(output);
}

}  // namespace minidl::ops
