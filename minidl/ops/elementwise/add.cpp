// add: y = a + b with NumPy broadcasting. Autograd also uses it on equal shapes to accumulate
// gradients at fan-out, which take map_binary's flat loop and pass dy through untouched.
// activation=relu (ops::FuseBiasActivation, a residual sum followed by a ReLU) gives max(a + b, 0)
// in the same pass, with relu's comparison (oneDNN: relu as a post-op of the binary primitive).
#include "minidl/ops/broadcast.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  activation_attr(c);
  infer_broadcast(c);
}

void add_native(const ir::KernelArgs& k) {
  if (activation_of(k.attrs()) == Activation::Relu) {
    map_broadcast(k, [](float a, float b) {
      const float s = a + b;
      return s > 0.0f ? s : 0.0f;
    });
    return;
  }
  map_broadcast(k, [](float a, float b) { return a + b; });
}

void grad(ir::GradCtx& g) {
  ir::Value* dy = g.out_grad(0);
  if (activation_of(g.attrs()) == Activation::Relu) dy = g.op(op_relu_bwd, {dy, g.output(0)});
  for (int i = 0; i < 2; ++i)
    if (g.needs_input_grad(i)) g.set_input_grad(i, reduce_to(g, dy, g.input(i)->shape()));
}

}  // namespace

MINIDL_OP(add)
    .inputs({"a", "b"})
    .attr<std::string>("activation", "none")
    .infer(infer)
    // A gradient sum between blocked values (BatchNorm's x) keeps their layout. A node that
    // broadcasts has values of different shapes, which never share a blocked layout.
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::add_kernel, onednn::binary_supports)
#endif
    .kernel(ir::Backend::Native, add_native)
    .grad(grad);

}  // namespace minidl::ops
