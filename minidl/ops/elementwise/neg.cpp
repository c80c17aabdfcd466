// neg: y = -x; dx = -dy.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void neg_native(const ir::KernelArgs& k) {
  map_unary(k, [](float x) { return -x; });
}

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.op(op_neg, {g.out_grad(0)})); }

}  // namespace

MINIDL_OP(neg)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::neg_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, neg_native)
    .grad(grad);

}  // namespace minidl::ops
