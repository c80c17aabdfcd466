// clip_coef: global-norm gradient clipping's factor from the sum of the gradients' squared
// norms, as torch.nn.utils.clip_grad_norm_ computes it:
//   norm = sqrt(sum_sq);  coef = min(1, max_norm / (norm + 1e-6))
// -> coef [] (the updates' grad_scale input) and norm [] (reported).
#include <cmath>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.input(0).numel() == 1 && c.dtype(0) == DType::F32,
                    "expected a single f32 element (the summed squared norms)");
  MINIDL_CHECK_NODE(c, c.attr<double>("max_norm") > 0.0, "max_norm must be positive, got ",
                    c.attr<double>("max_norm"));
  c.set_output(0, Shape{});
  c.set_output(1, Shape{});
}

void clip_coef_native(const ir::KernelArgs& k) {
  const float norm = std::sqrt(*k.in[0].data<float>());
  const auto max_norm = static_cast<float>(k.attrs().get<double>("max_norm"));
  *k.out[0].data<float>() = std::min(1.0f, max_norm / (norm + 1e-6f));
  *k.out[1].data<float>() = norm;
}

}  // namespace

MINIDL_OP(clip_coef)
    .inputs({"sum_sq"})
    .outputs({"coef", "norm"})
    .attr<double>("max_norm")
    .infer(infer)
    .kernel(ir::Backend::Native, clip_coef_native)
    .no_grad("a clipping factor: gradients are not differentiated again");

}  // namespace minidl::ops
