// oneDNN matmul for the matmul op. The transposes are strides in the memory descriptors, so
// trans_a / trans_b read the stored operands in place (in f32; a node whose precision is bf16
// reorders its factors into bf16 each step); the optional bias is the primitive's own
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
  // In mixed precision the factors are bf16 in the layouts oneDNN picks (reordered into them
  // each step, the transposes with them); the product is stored in f32 either way.
  const bool bf16 = ir::node_precision(n) == ir::Precision::BF16;
  const auto any_bf16 = [](std::int64_t rows, std::int64_t cols) {
    return dnnl::memory::desc({rows, cols}, dnnl::memory::data_type::bf16,
                              dnnl::memory::format_tag::any);
  };
  const dnnl::memory::desc src = bf16 ? any_bf16(m, k) : matrix_desc(m, k, ta);
  const dnnl::memory::desc weights = bf16 ? any_bf16(k, cols) : matrix_desc(k, cols, tb);
  const dnnl::memory::desc dst = matrix_desc(m, cols, false);
  dnnl::primitive_attr attr;
  // Its own scratch memory (a buffer of the staged kernel), as the convolutions have
  // (conv.cpp): the bf16 products run at once in thread replicas.
  if (bf16) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
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
    if (ir::node_precision(n) == ir::Precision::BF16) {
      const Shape& a = n.input(0)->shape();
      const Shape& b = n.input(1)->shape();
      const bool ta = n.attrs().get<bool>("trans_a");
      const bool tb = n.attrs().get<bool>("trans_b");
      Staged s{dnnl::matmul(pd), n};
      s.add(DNNL_ARG_SRC, matrix_desc(ta ? a[1] : a[0], ta ? a[0] : a[1], ta), pd.src_desc(),
            Args::Side::In, 0);
      s.add(DNNL_ARG_WEIGHTS, matrix_desc(tb ? b[1] : b[0], tb ? b[0] : b[1], tb),
            pd.weights_desc(), Args::Side::In, 1);
      if (n.inputs().size() > 2)
        s.add(DNNL_ARG_BIAS, pd.bias_desc(), pd.bias_desc(), Args::Side::In, 2);
      s.add(DNNL_ARG_DST, pd.dst_desc(), pd.dst_desc(), Args::Side::Out, 0);
      s.buffer(DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc());
      return staged_kernel(std::move(s));
    }
    Args args;
    args.add(DNNL_ARG_SRC, pd.src_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_WEIGHTS, pd.weights_desc(), Args::Side::In, 1);
    if (n.inputs().size() > 2) args.add(DNNL_ARG_BIAS, pd.bias_desc(), Args::Side::In, 2);
    args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::matmul(pd), std::move(args));
  });
}

}  // namespace minidl::ops::onednn
