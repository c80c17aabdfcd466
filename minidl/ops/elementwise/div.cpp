// div: y = a / b with NumPy broadcasting (IEEE: a zero divisor gives an infinity or NaN).
#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void div_native(const ir::KernelArgs& k) {
  map_broadcast(k, [](float a, float b) { return a / b; });
}

// da = reduce(dy / b); db = -reduce(dy * y / b), since d(a/b)/db = -a/b^2 = -y/b.
void grad(ir::GradCtx& g) {
  ir::Value* dy = g.out_grad(0);
  if (g.needs_input_grad(0))
    g.set_input_grad(0, reduce_to(g, g.op(op_div, {dy, g.input(1)}), g.input(0)->shape()));
  if (g.needs_input_grad(1)) {
    ir::Value* t = g.op(op_div, {g.op(op_mul, {dy, g.output(0)}), g.input(1)});
    g.set_input_grad(1, g.op(op_neg, {reduce_to(g, t, g.input(1)->shape())}));
  }
}

}  // namespace

MINIDL_OP(div)
    .inputs({"a", "b"})
    .infer(infer_broadcast)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::div_kernel, onednn::binary_supports)
#endif
    .kernel(ir::Backend::Native, div_native)
    .grad(grad);

}  // namespace minidl::ops
