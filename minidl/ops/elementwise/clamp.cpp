// clamp: y = min(max(x, min), max); either bound may be infinite (the defaults: no bound).
// clamp_bwd(dy, x): dx = dy where min <= x <= max (a bound itself passes the gradient, as in
// PyTorch), 0 outside. NaN passes through the forward.
#include <cmath>
#include <limits>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void infer(ir::InferCtx& c) {
  const double lo = c.attr<double>("min"), hi = c.attr<double>("max");
  MINIDL_CHECK_NODE(c, !std::isnan(lo) && !std::isnan(hi) && lo <= hi, "min ", lo,
                    " must not exceed max ", hi);
  infer_unary_f32(c);
}

void infer_bwd(ir::InferCtx& c) {
  infer(c);
  infer_same_shapes(c);
}

void clamp_native(const ir::KernelArgs& k) {
  const float lo = k.attrs().get<float>("min"), hi = k.attrs().get<float>("max");
  map_unary(k, [lo, hi](float x) { return x < lo ? lo : (x > hi ? hi : x); });
}

void clamp_bwd_native(const ir::KernelArgs& k) {
  const float lo = k.attrs().get<float>("min"), hi = k.attrs().get<float>("max");
  map_binary(k, [lo, hi](float dy, float x) { return lo <= x && x <= hi ? dy : 0.0f; });
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_clamp_bwd, {g.out_grad(0), g.input(0)}, g.attrs()));
}

}  // namespace

MINIDL_OP(clamp)
    .inputs({"x"})
    .attr<float>("min", -kInf)
    .attr<float>("max", kInf)
    .infer(infer)
    .elementwise()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::clamp_kernel, onednn::eltwise_supports)
#endif
    .kernel(ir::Backend::Native, clamp_native)
    .grad(grad);

MINIDL_OP(clamp_bwd)
    .inputs({"dy", "x"})
    .outputs({"dx"})
    .attr<float>("min", -kInf)
    .attr<float>("max", kInf)
    .infer(infer_bwd)
    .elementwise()
    .kernel(ir::Backend::Native, clamp_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
