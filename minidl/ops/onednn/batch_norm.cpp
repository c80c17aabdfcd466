// oneDNN batch normalization for batch_norm and batch_norm_bwd, always with
// normalization_flags::use_global_stats: mean and variance are inputs (bn_moments' batch
// statistics, or the running statistics), so the forward is y = (x - mean) * invstd * scale +
// shift, and the backward gives dx = dy * scale * invstd with mean and variance held constant,
// and the scale and shift gradients, as batch_norm_bwd defines them. The op's own code then
// derives dmean and dvar from those two in O(C).
//
// The primitive runs in x's layout (plain, or the channel-blocked one ops::PropagateLayouts
// gave it); y, dy or dx in another layout are reordered to it and back (Staged). Without a
// weight (affine=false) the forward uses no scale; the backward, which needs diff_scale for dvar,
// gets a scale of ones that the kernel owns (and, as oneDNN 2.6 asks with use_shift, a shift).
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

using dnnl::memory;
using dnnl::normalization_flags;
using dnnl::prop_kind;

float eps_of(const ir::Node& n) { return n.attrs().get<float>("eps"); }

// batch_norm: x, mean, var, weight?, bias? -> y (a residual input is the native kernel's); with
// activation relu, max(y, 0) in the same pass (fuse_norm_relu, which in inference needs no
// workspace).
dnnl::batch_normalization_forward::primitive_desc forward_pd(const ir::Node& n) {
  normalization_flags flags = normalization_flags::use_global_stats;
  if (activation_of(n.attrs()) == Activation::Relu)
    flags = flags | normalization_flags::fuse_norm_relu;
  if (n.inputs().size() > 3) flags = flags | normalization_flags::use_scale;
  if (n.inputs().size() > 4) flags = flags | normalization_flags::use_shift;
  const dnnl::batch_normalization_forward::desc d(prop_kind::forward_inference,
                                                  value_desc(n.input(0)), eps_of(n), flags);
  return {d, engine()};
}

// batch_norm_bwd: dy, x, mean, var, weight? -> dx, dweight, dbias (, dmean, dvar by the op)
dnnl::batch_normalization_backward::primitive_desc backward_pd(const ir::Node& n) {
  const normalization_flags flags = normalization_flags::use_global_stats |
                                    normalization_flags::use_scale | normalization_flags::use_shift;
  const memory::desc data = value_desc(n.input(1));
  const dnnl::batch_normalization_forward::primitive_desc hint(
      dnnl::batch_normalization_forward::desc(prop_kind::forward_training, data, eps_of(n), flags),
      engine());
  const dnnl::batch_normalization_backward::desc d(prop_kind::backward, data, data, eps_of(n),
                                                   flags);
  return {d, engine(), hint};
}

template <typename Make>
bool supports(const ir::Node& n, std::string* why, Make&& make) {
  return supported(check_f32_nonempty(n), why, std::forward<Make>(make));
}

/// A constant [C] vector owned by the kernel: the scale of a BatchNorm without weight (ones), or
/// the shift the backward is given but does not use (zeros).
void constant(Staged& s, int arg, std::int64_t ch, float value) {
  const memory m = s.buffer(arg, flat_desc(ch));
  std::fill_n(static_cast<float*>(m.get_data_handle()), ch, value);
}

}  // namespace

bool batch_norm_supports(const ir::Node& n, std::string* why) {
  if (n.inputs().size() > 5) {
    // oneDNN 2.6's batch normalization has no sum post-op; the native kernel adds the residual.
    if (why != nullptr) *why = "oneDNN's batch normalization takes no residual input";
    return false;
  }
  return supports(n, why, [&] { return forward_pd(n); });
}

bool batch_norm_bwd_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, [&] { return backward_pd(n); });
}

ir::Kernel batch_norm_kernel(const ir::Node& n) {
  return create(n, [&] {
    const auto pd = forward_pd(n);
    const std::int64_t ch = n.input(0)->shape()[1];
    Staged s{dnnl::batch_normalization_forward(pd), n};
    s.add(DNNL_ARG_SRC, value_desc(n.input(0)), pd.src_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_MEAN, flat_desc(ch), pd.mean_desc(), Args::Side::In, 1);
    s.add(DNNL_ARG_VARIANCE, flat_desc(ch), pd.variance_desc(), Args::Side::In, 2);
    if (n.inputs().size() > 3)
      s.add(DNNL_ARG_SCALE, flat_desc(ch), flat_desc(ch), Args::Side::In, 3);
    if (n.inputs().size() > 4)
      s.add(DNNL_ARG_SHIFT, flat_desc(ch), flat_desc(ch), Args::Side::In, 4);
    s.add(DNNL_ARG_DST, value_desc(n.output(0)), pd.dst_desc(), Args::Side::Out, 0);
    return staged_kernel(std::move(s));
  });
}

ir::KernelFactory batch_norm_bwd_kernel(ir::KernelFn mean_var_grads) {
  return [mean_var_grads](const ir::Node& n) {
    return create(n, [&] {
      const auto pd = backward_pd(n);
      const std::int64_t ch = n.input(1)->shape()[1];
      Staged s{dnnl::batch_normalization_backward(pd), n};
      s.add(DNNL_ARG_DIFF_DST, value_desc(n.input(0)), pd.diff_dst_desc(), Args::Side::In, 0);
      s.add(DNNL_ARG_SRC, value_desc(n.input(1)), pd.src_desc(), Args::Side::In, 1);
      s.add(DNNL_ARG_MEAN, flat_desc(ch), pd.mean_desc(), Args::Side::In, 2);
      s.add(DNNL_ARG_VARIANCE, flat_desc(ch), pd.variance_desc(), Args::Side::In, 3);
      if (n.inputs().size() > 4) {
        s.add(DNNL_ARG_SCALE, flat_desc(ch), flat_desc(ch), Args::Side::In, 4);
      } else {
        constant(s, DNNL_ARG_SCALE, ch, 1.0f);
      }
      // With use_shift the primitive takes a shift argument, although dx does not depend on it.
      constant(s, DNNL_ARG_SHIFT, ch, 0.0f);
      s.add(DNNL_ARG_DIFF_SRC, value_desc(n.output(0)), pd.diff_src_desc(), Args::Side::Out, 0);
      s.add(DNNL_ARG_DIFF_SCALE, flat_desc(ch), flat_desc(ch), Args::Side::Out, 1);
      s.add(DNNL_ARG_DIFF_SHIFT, flat_desc(ch), flat_desc(ch), Args::Side::Out, 2);
      return staged_kernel(std::move(s), mean_var_grads);
    });
  };
}

}  // namespace minidl::ops::onednn
