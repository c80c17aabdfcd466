// add: y = a + b, same shapes. Autograd also uses it to accumulate gradients at fan-out.
#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void add_native(const ir::KernelArgs& k) {
  map_binary(k, [](float a, float b) { return a + b; });
}

void grad(ir::GradCtx& g) {
  for (int i = 0; i < 2; ++i)
    if (g.needs_input_grad(i)) g.set_input_grad(i, g.out_grad(0));
}

}  // namespace

MINIDL_OP(add)
    .inputs({"a", "b"})
    .infer(infer_same_shapes)
    .elementwise()  // a gradient sum between blocked values (BatchNorm's x) keeps their layout
    .kernel(ir::Backend::Native, add_native)
    .grad(grad);

}  // namespace minidl::ops
