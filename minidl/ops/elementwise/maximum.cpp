// maximum: y = the larger of a and b elementwise, NumPy broadcasting; maximum_bwd routes dy to the
// input that was picked. Ties (a == b) give the whole gradient to a, none to b.
#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

// a >= b picks a, so a tie goes to a, in the value and in the gradient.
bool pick_a(float a, float b) { return a >= b; }

void maximum_native(const ir::KernelArgs& k) {
  map_broadcast(k, [](float a, float b) { return pick_a(a, b) ? a : b; });
}

void maximum_bwd_native(const ir::KernelArgs& k) { select_bwd(k, pick_a); }

void grad(ir::GradCtx& g) { select_grad(g, op_maximum_bwd); }

}  // namespace

MINIDL_OP(maximum)
    .inputs({"a", "b"})
    .infer(infer_broadcast)
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::maximum_kernel, onednn::binary_supports)
#endif
    .kernel(ir::Backend::Native, maximum_native)
    .grad(grad);

MINIDL_OP(maximum_bwd)
    .inputs({"dy", "a", "b"})
    .outputs({"da", "db"})
    .infer(infer_select_bwd)
    .kernel(ir::Backend::Native, maximum_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
