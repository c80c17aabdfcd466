// mul: y = a * b elementwise, same shapes.
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void mul_native(const ir::KernelArgs& k) {
  map_binary(k, [](float a, float b) { return a * b; });
}

void grad(ir::GradCtx& g) {
  if (g.needs_input_grad(0)) g.set_input_grad(0, g.op(op_mul, {g.out_grad(0), g.input(1)}));
  if (g.needs_input_grad(1)) g.set_input_grad(1, g.op(op_mul, {g.out_grad(0), g.input(0)}));
}

}  // namespace

MINIDL_OP(mul)
    .inputs({"a", "b"})
    .infer(infer_same_shapes)
    .kernel(ir::Backend::Native, mul_native)
    .grad(grad);

}  // namespace minidl::ops
