// Source ops: values supplied from outside the graph. `input` is fed every step (a batch),
// `parameter` is trainable persistent storage, `state` is persistent but not trained: the
// optimizer's momentum, a module's buffers. Autograd differentiates with respect to parameters
// only, the optimizer updates and the data-parallel pass reduces only their gradients.
#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const auto dims = c.attr<ir::Ints>("shape");
  for (auto d : dims) MINIDL_CHECK_NODE(c, d > 0, "dimensions must be positive, got ", Shape(dims));
  DType t;
  try {
    t = parse_dtype(c.attr<std::string>("dtype"));
  } catch (const Error& e) {
    c.fail(e.what());
  }
  c.set_output(0, Shape(dims), t);
}

}  // namespace

MINIDL_OP(input)
    .inputs({})
    .attr<ir::Ints>("shape")
    .attr<std::string>("dtype", "f32")
    .infer(infer)
    .source()
    .no_grad("a leaf: gradients stop at graph inputs");

MINIDL_OP(parameter)
    .inputs({})
    .attr<ir::Ints>("shape")
    .attr<std::string>("dtype", "f32")
    .infer(infer)
    .source()
    .no_grad("a leaf: autograd returns the gradient of a parameter, it does not go further");

MINIDL_OP(state)
    .inputs({})
    .attr<ir::Ints>("shape")
    .attr<std::string>("dtype", "f32")
    .infer(infer)
    .source()
    .no_grad("state (optimizer state, module buffers) is not differentiated");

}  // namespace minidl::ops
