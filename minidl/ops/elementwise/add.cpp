// add: y = a + b with NumPy broadcasting. Autograd also uses it on equal shapes to accumulate
// gradients at fan-out, which take map_binary's flat loop and pass dy through untouched.
#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void add_native(const ir::KernelArgs& k) {
  map_broadcast(k, [](float a, float b) { return a + b; });
}

void grad(ir::GradCtx& g) {
  for (int i = 0; i < 2; ++i)
    if (g.needs_input_grad(i))
      g.set_input_grad(i, reduce_to(g, g.out_grad(0), g.input(i)->shape()));
}

}  // namespace

MINIDL_OP(add)
    .inputs({"a", "b"})
    .infer(infer_broadcast)
    // A gradient sum between blocked values (BatchNorm's x) keeps their layout. A node that
    // broadcasts has values of different shapes, which never share a blocked layout.
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::add_kernel, onednn::binary_supports)
#endif
    .kernel(ir::Backend::Native, add_native)
    .grad(grad);

}  // namespace minidl::ops
