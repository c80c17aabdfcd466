// mul: y = a * b elementwise with NumPy broadcasting.
#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void mul_native(const ir::KernelArgs& k) {
  map_broadcast(k, [](float a, float b) { return a * b; });
}

// da = reduce(dy * b), db = reduce(dy * a): the products have the output's shape.
void grad(ir::GradCtx& g) {
  for (int i = 0; i < 2; ++i) {
    if (!g.needs_input_grad(i)) continue;
    ir::Value* d = g.op(op_mul, {g.out_grad(0), g.input(1 - i)});
    g.set_input_grad(i, reduce_to(g, d, g.input(i)->shape()));
  }
}

}  // namespace

MINIDL_OP(mul)
    .inputs({"a", "b"})
    .infer(infer_broadcast)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::mul_kernel, onednn::binary_supports)
#endif
    .kernel(ir::Backend::Native, mul_native)
    .grad(grad);

}  // namespace minidl::ops
