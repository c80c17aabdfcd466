// sub: y = a - b with NumPy broadcasting.
#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void sub_native(const ir::KernelArgs& k) {
  map_broadcast(k, [](float a, float b) { return a - b; });
}

void grad(ir::GradCtx& g) {
  if (g.needs_input_grad(0)) g.set_input_grad(0, reduce_to(g, g.out_grad(0), g.input(0)->shape()));
  if (g.needs_input_grad(1)) {
    // Reduce first: the negation then runs on b's (smaller) shape.
    g.set_input_grad(1, g.op(op_neg, {reduce_to(g, g.out_grad(0), g.input(1)->shape())}));
  }
}

}  // namespace

MINIDL_OP(sub)
    .inputs({"a", "b"})
    .infer(infer_broadcast)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::sub_kernel, onednn::binary_supports)
#endif
    .kernel(ir::Backend::Native, sub_native)
    .grad(grad);

}  // namespace minidl::ops
