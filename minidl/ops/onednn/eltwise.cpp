// oneDNN eltwise for relu, sigmoid and tanh and their backward ops, and for exp, log, sqrt, neg
// (linear), pow and clamp (clip). The backward ops receive
// the forward output y, not x, so they use the *_use_dst_for_bwd algorithms. The node's values
// share one stored type (ir::layout_refusal): f32, or bf16 between bf16 kernels.
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

using dnnl::algorithm;
using dnnl::prop_kind;

// src x -> dst y, over all elements as one dimension; alpha and beta as the algorithm reads them.
ir::Kernel eltwise_fwd(const ir::Node& n, algorithm alg, float alpha = 0.0f, float beta = 0.0f) {
  return create(n, [&] {
    const dnnl::memory::desc md =
        flat_desc(n.input(0)->shape().numel(), data_type_of(n.input(0)->stored()));
    const dnnl::eltwise_forward::primitive_desc pd(
        dnnl::eltwise_forward::desc(prop_kind::forward_inference, alg, md, alpha, beta), engine());
    Args args;
    args.add(DNNL_ARG_SRC, pd.src_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::eltwise_forward(pd), std::move(args));
  });
}

// diff_dst dy, dst y -> diff_src dx. oneDNN 2.6 wants a forward primitive descriptor as a hint
// for every backward one; it is built for the same algorithm and never run.
ir::Kernel eltwise_bwd(const ir::Node& n, algorithm alg) {
  return create(n, [&] {
    const dnnl::memory::desc md =
        flat_desc(n.input(0)->shape().numel(), data_type_of(n.input(0)->stored()));
    const dnnl::eltwise_forward::primitive_desc hint(
        dnnl::eltwise_forward::desc(prop_kind::forward_training, alg, md), engine());
    const dnnl::eltwise_backward::primitive_desc pd(dnnl::eltwise_backward::desc(alg, md, md),
                                                    engine(), hint);
    Args args;
    args.add(DNNL_ARG_DIFF_DST, pd.diff_dst_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_DST, md, Args::Side::In, 1);
    args.add(DNNL_ARG_DIFF_SRC, pd.diff_src_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::eltwise_backward(pd), std::move(args));
  });
}

}  // namespace

bool eltwise_supports(const ir::Node& n, std::string* why) {
  std::string reason = check_f32_nonempty(n);
  if (why != nullptr) *why = reason;
  return reason.empty();
}

// ReLU with alpha 0; oneDNN's backward masks with dst > 0, as the native kernel does.
ir::Kernel relu_kernel(const ir::Node& n) { return eltwise_fwd(n, algorithm::eltwise_relu); }
ir::Kernel sigmoid_kernel(const ir::Node& n) { return eltwise_fwd(n, algorithm::eltwise_logistic); }
ir::Kernel tanh_kernel(const ir::Node& n) { return eltwise_fwd(n, algorithm::eltwise_tanh); }

ir::Kernel exp_kernel(const ir::Node& n) { return eltwise_fwd(n, algorithm::eltwise_exp); }
ir::Kernel log_kernel(const ir::Node& n) { return eltwise_fwd(n, algorithm::eltwise_log); }
ir::Kernel sqrt_kernel(const ir::Node& n) { return eltwise_fwd(n, algorithm::eltwise_sqrt); }
// linear: alpha * x + beta.
ir::Kernel neg_kernel(const ir::Node& n) {
  return eltwise_fwd(n, algorithm::eltwise_linear, -1.0f, 0.0f);
}
// pow: alpha * x^beta.
ir::Kernel pow_kernel(const ir::Node& n) {
  return eltwise_fwd(n, algorithm::eltwise_pow, 1.0f, n.attrs().get<float>("exponent"));
}
// clip: alpha the lower bound, beta the upper one.
ir::Kernel clamp_kernel(const ir::Node& n) {
  return eltwise_fwd(n, algorithm::eltwise_clip, n.attrs().get<float>("min"),
                     n.attrs().get<float>("max"));
}

ir::Kernel relu_bwd_kernel(const ir::Node& n) {
  return eltwise_bwd(n, algorithm::eltwise_relu_use_dst_for_bwd);
}
ir::Kernel sigmoid_bwd_kernel(const ir::Node& n) {
  return eltwise_bwd(n, algorithm::eltwise_logistic_use_dst_for_bwd);
}
ir::Kernel tanh_bwd_kernel(const ir::Node& n) {
  return eltwise_bwd(n, algorithm::eltwise_tanh_use_dst_for_bwd);
}

}  // namespace minidl::ops::onednn
