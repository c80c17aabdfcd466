// oneDNN softmax for softmax_cross_entropy's probs. The loss stays the op's own code (the
// log-sum-exp in double from the logits): -log of a float probability that underflowed to 0
// would be infinite.
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {

bool softmax_cross_entropy_supports(const ir::Node& n, std::string* why) {
  std::string reason;
  if (n.input(0)->dtype() != DType::F32) {
    reason = fmt::format("logits are {}, the oneDNN kernels take f32 only", n.input(0)->dtype());
  } else if (n.input(0)->shape().numel() == 0) {
    reason = fmt::format("logits are empty ({})", n.input(0)->shape());
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

ir::KernelFactory softmax_cross_entropy_kernel(ir::KernelFn loss) {
  return [loss](const ir::Node& n) {
    return create(n, [&] {
      // logits [N,C] -> probs [N,C], softmax over axis 1
      const dnnl::memory::desc md = plain_desc(n.input(0)->shape());
      const dnnl::softmax_forward::primitive_desc pd(
          dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1), engine());
      Args args;
      args.add(DNNL_ARG_SRC, pd.src_desc(), Args::Side::In, 0);
      args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 1);
      return primitive_kernel(dnnl::softmax_forward(pd), std::move(args), loss);
    });
  };
}

}  // namespace minidl::ops::onednn
