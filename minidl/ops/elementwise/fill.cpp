// fill: a constant tensor of the given shape (the seed of the backward pass, zero gradients).
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const auto dims = c.attr<ir::Ints>("shape");
  for (auto d : dims) MINIDL_CHECK_NODE(c, d > 0, "dimensions must be positive, got ", Shape(dims));
  c.set_output(0, Shape(dims));
}

void fill_native(const ir::KernelArgs& k) {
  std::fill_n(k.out[0].data<float>(), k.out[0].numel(), k.attrs().get<float>("value"));
}

}  // namespace

MINIDL_OP(fill)
    .inputs({})
    .attr<ir::Ints>("shape")
    .attr<float>("value", 0.0f)
    .infer(infer)
    .kernel(ir::Backend::Native, fill_native)
    .no_grad("a constant");

}  // namespace minidl::ops
