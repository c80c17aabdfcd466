#include "minidl/ops/ops.hpp"

#include <algorithm>

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

Value* concat(const std::vector<Value*>& xs, int axis) {
  MINIDL_CHECK(!xs.empty(), "concat: no inputs");
  if (xs.size() <= static_cast<std::size_t>(kMaxConcatInputs))
    return apply("concat", xs, {{"axis", std::int64_t{axis}}});
  // Groups of kMaxConcatInputs, then the groups' results: concat is associative.
  std::vector<Value*> parts;
  for (std::size_t i = 0; i < xs.size(); i += kMaxConcatInputs) {
    const auto end = std::min(xs.size(), i + kMaxConcatInputs);
    parts.push_back(concat(std::vector<Value*>(xs.begin() + static_cast<std::ptrdiff_t>(i),
                                               xs.begin() + static_cast<std::ptrdiff_t>(end)),
                           axis));
  }
  return concat(parts, axis);
}

Value* transpose(Value* x, int d0, int d1) {
  const int r = x->shape().rank();
  MINIDL_CHECK(d0 >= -r && d0 < r && d1 >= -r && d1 < r, "transpose: dimensions ", d0, " and ", d1,
               " are out of range for ", x->shape());
  ir::Ints perm(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(d0 < 0 ? d0 + r : d0)],
            perm[static_cast<std::size_t>(d1 < 0 ? d1 + r : d1)]);
  return permute(x, std::move(perm));
}

}  // namespace minidl::ops
