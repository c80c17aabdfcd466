#include "minidl/ops/common.hpp"

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

}  // namespace minidl::ops

namespace minidl::ops {

void infer_unary_f32(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  c.set_output(0, c.input(0));
}

}  // namespace minidl::ops
