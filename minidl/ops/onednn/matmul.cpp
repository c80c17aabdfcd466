// oneDNN matmul for the matmul op. The transposes are strides in the memory descriptors, so
// trans_a / trans_b read the stored operands in place; the optional bias is the primitive's own
// ([1,N], broadcast over rows) and a fused ReLU is an eltwise post-op.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

dnnl::matmul::primitive_desc matmul_pd(const ir::Node& n) {
  const Shape& a = n.input(0)->shape();
  const Shape& b = n.input(1)->shape();
  const bool ta = n.attrs().get<bool>("trans_a");
  const bool tb = n.attrs().get<bool>("trans_b");
  const std::int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1], cols = tb ? b[0] : b[1];
  const dnnl::memory::desc src = matrix_desc(m, k, ta), weights = matrix_desc(k, cols, tb);
  const dnnl::memory::desc dst = matrix_desc(m, cols, false);
  dnnl::primitive_attr attr;
  if (activation_of(n.attrs()) == Activation::Relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  if (n.inputs().size() > 2) {
    const dnnl::matmul::desc d(src, weights, matrix_desc(1, cols, false), dst);
    return dnnl::matmul::primitive_desc(d, attr, engine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, engine());
}

}  // namespace

bool matmul_supports(const ir::Node& n, std::string* why) {
  return supported(check_f32_nonempty(n), why, [&] { return matmul_pd(n); });
}

ir::Kernel matmul_kernel(const ir::Node& n) {
  return create(n, [&] {
    const dnnl::matmul::primitive_desc pd = matmul_pd(n);
    Args args;
    args.add(DNNL_ARG_SRC, pd.src_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_WEIGHTS, pd.weights_desc(), Args::Side::In, 1);
    if (n.inputs().size() > 2) args.add(DNNL_ARG_BIAS, pd.bias_desc(), Args::Side::In, 2);
    args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::matmul(pd), std::move(args));
  });
}

}  // namespace minidl::ops::onednn
