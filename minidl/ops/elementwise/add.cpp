// add: y = a + b, same shapes. Autograd also uses it to accumulate gradients at fan-out.
// Elementwise: a residual block's sum (nn::Residual) and the gradient sum where its input fans
// out stay in oneDNN's blocked layout between the convolutions around them.
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
    .elementwise()
    .kernel(ir::Backend::Native, add_native)
    .grad(grad);

}  // namespace minidl::ops
