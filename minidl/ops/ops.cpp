#include "minidl/ops/ops.hpp"

namespace minidl::ops {

namespace {
ir::Attrs source_attrs(const Shape& shape, DType dtype) {
  return {{"shape", shape.dims()}, {"dtype", std::string(dtype_name(dtype))}};
}
}  // namespace

Value* input(ir::Graph& g, const std::string& name, const Shape& shape, DType dtype) {
  return g.add_source(op("input"), source_attrs(shape, dtype), name, Tensor())->output();
}

Value* parameter(ir::Graph& g, const std::string& name, const Tensor& storage) {
  return g
      .add_source(op("parameter"), source_attrs(storage.shape(), storage.dtype()), name, storage)
      ->output();
}

Value* state(ir::Graph& g, const std::string& name, const Tensor& storage) {
  return g.add_source(op("state"), source_attrs(storage.shape(), storage.dtype()), name, storage)
      ->output();
}

Value* role_input(ir::Graph& g, ir::Role role, const std::string& name, const Shape& shape,
                  DType dtype) {
  if (ir::Node* n = g.find(role)) {
    MINIDL_CHECK(n->output()->shape() == shape && n->output()->dtype() == dtype, n->describe(),
                 ": the graph's input for this role is ", n->output()->dtype(), " ",
                 n->output()->shape(), ", expected ", dtype, " ", shape);
    return n->output();
  }
  ir::Node* n = g.add_source(op("input"), source_attrs(shape, dtype), name, Tensor());
  n->set_role(role);
  return n->output();
}

Value* rng_key(ir::Graph& g) {
  return role_input(g, ir::Role::RngKey, "rng_key", Shape{2}, DType::I64);
}

Value* fill(ir::Graph& g, const Shape& shape, float value) {
  return g.add_node(op("fill"), {}, {{"shape", shape.dims()}, {"value", double{value}}})->output();
}

}  // namespace minidl::ops
