#include "minidl/ops/common.hpp"

#include "minidl/ops/op_table.hpp"

namespace minidl::ops {

void infer_like_input0(ir::InferCtx& c) { c.set_output(0, c.input(0), c.dtype(0)); }

void infer_same_shapes(ir::InferCtx& c) {
  for (int i = 0; i < c.num_inputs(); ++i) {
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32, got ", c.dtype(i));
    MINIDL_CHECK_NODE(c, c.input(i) == c.input(0), "input ", i, " has shape ", c.input(i),
                      ", expected the shape of input 0, ", c.input(0));
  }
  c.set_output(0, c.input(0));
}

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "i32") return DType::I32;
  if (name == "i64") return DType::I64;
  MINIDL_FAIL("unknown dtype '", name, "' (expected f32, i32 or i64)");
}

namespace {
bool parse_activation(const std::string& name, Activation& out) {
  if (name == "none")
    out = Activation::None;
  else if (name == "relu")
    out = Activation::Relu;
  else
    return false;
  return true;
}
}  // namespace

Activation activation_attr(ir::InferCtx& c) {
  const auto name = c.attr<std::string>("activation");
  Activation a{};
  MINIDL_CHECK_NODE(c, parse_activation(name, a), "unknown activation '", name,
                    "' (expected none or relu)");
  return a;
}

Activation activation_of(const ir::Attrs& attrs) {
  Activation a{};
  const auto& name = attrs.get<std::string>("activation");
  MINIDL_CHECK(parse_activation(name, a), "unknown activation '", name, "'");
  return a;
}

ir::Value* fused_bias_activation_grad(ir::GradCtx& g, int bias_input) {
  ir::Value* dz = g.out_grad(0);
  if (activation_of(g.attrs()) == Activation::Relu) dz = g.op(op_relu_bwd, {dz, g.output(0)});
  if (g.num_inputs() > bias_input && g.needs_input_grad(bias_input))
    g.set_input_grad(bias_input, g.op(op_bias_add_bwd, {dz}));
  return dz;
}

}  // namespace minidl::ops

namespace minidl::ops {

void infer_unary_f32(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  c.set_output(0, c.input(0));
}

void check_scalar_input(ir::InferCtx& c, int i, DType dtype) {
  if (i >= c.num_inputs()) return;
  MINIDL_CHECK_NODE(c, c.input(i).numel() == 1 && c.dtype(i) == dtype, "input ", i, " (",
                    c.node().def().input_names()[static_cast<std::size_t>(i)],
                    ") must be a single ", dtype, " element, got ", c.input(i), " ", c.dtype(i));
}

float scalar_input(const ir::KernelArgs& k, int i, float fallback) {
  return static_cast<int>(k.in.size()) > i ? *k.in[static_cast<std::size_t>(i)].data<float>()
                                           : fallback;
}

}  // namespace minidl::ops
