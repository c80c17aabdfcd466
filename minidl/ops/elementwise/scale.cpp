// scale: y = alpha * x.
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void scale_native(const ir::KernelArgs& k) {
  const float alpha = k.attrs().get<float>("alpha");
  map_unary(k, [alpha](float x) { return alpha * x; });
}

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.op(op_scale, {g.out_grad(0)}, g.attrs())); }

}  // namespace

MINIDL_OP(scale)
    .inputs({"x"})
    .attr<float>("alpha")
    .infer(infer_unary_f32)
    .kernel(ir::Backend::Native, scale_native)
    .grad(grad);

}  // namespace minidl::ops
