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

Value* fill(ir::Graph& g, const Shape& shape, float value) {
  return g.add_node(op("fill"), {}, {{"shape", shape.dims()}, {"value", double{value}}})->output();
}

}  // namespace minidl::ops
