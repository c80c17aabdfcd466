// oneDNN matmul for the matmul op. The transposes are strides in the memory descriptors, so
// trans_a / trans_b read the stored operands in place (in f32; a node whose precision is bf16
// reorders its f32 factors into bf16 each step and reads those stored as bf16 in place); the
// optional bias is the primitive's own
// ([1,N], broadcast over rows) and a fused ReLU is an eltwise post-op.
#include <fmt/format.h>

#include <string_view>

#include "minidl/core/log.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

/// Factor i (0: a, 1: b) of n as stored: [rows, cols] of its stored type, over the stored
/// transpose when `trans`.
dnnl::memory::desc factor_desc(const ir::Node& n, int i) {
  const Shape& s = n.input(i)->shape();
  const bool t = n.attrs().get<bool>(i == 0 ? "trans_a" : "trans_b");
  dnnl::memory::desc d = matrix_desc(t ? s[1] : s[0], t ? s[0] : s[1], t);
  if (n.input(i)->stored() != DType::BF16) return d;
  const dnnl::memory::dims dims = d.dims();
  const dnnl::memory::dims strides =
      t ? dnnl::memory::dims{1, dims[0]} : dnnl::memory::dims{dims[1], 1};
  return dnnl::memory::desc(dims, dnnl::memory::data_type::bf16, strides);
}

/// The primitive with the factors stored as bf16 read in place (in_place) or reordered into the
/// layout oneDNN picks.
dnnl::matmul::primitive_desc matmul_pd(const ir::Node& n, bool in_place) {
  const Shape& a = n.input(0)->shape();
  const Shape& b = n.input(1)->shape();
  const bool ta = n.attrs().get<bool>("trans_a");
  const bool tb = n.attrs().get<bool>("trans_b");
  const std::int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1], cols = tb ? b[0] : b[1];
  // In mixed precision an f32 factor is bf16 in the layout oneDNN picks (reordered into it each
  // step, the transpose with it); a factor stored as bf16 (a bf16_copy several products share,
  // ops::share_bf16_factors) is read as it is stored. The product is stored in f32 either way.
  const bool bf16 = ir::node_precision(n) == ir::Precision::BF16;
  const auto bf16_factor = [&](int i, std::int64_t rows, std::int64_t cols) {
    if (in_place && n.input(i)->stored() == DType::BF16) return factor_desc(n, i);
    return dnnl::memory::desc({rows, cols}, dnnl::memory::data_type::bf16,
                              dnnl::memory::format_tag::any);
  };
  const dnnl::memory::desc src = bf16 ? bf16_factor(0, m, k) : matrix_desc(m, k, ta);
  const dnnl::memory::desc weights = bf16 ? bf16_factor(1, k, cols) : matrix_desc(k, cols, tb);
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

/// The primitive for n: bf16 factors read in place where oneDNN has more than its reference
/// kernel for their layouts (a transposed one may lack it), else reordered (bf16 to bf16).
dnnl::matmul::primitive_desc matmul_pd(const ir::Node& n) {
  dnnl::matmul::primitive_desc pd = matmul_pd(n, true);
  const bool stored_bf16 =
      n.input(0)->stored() == DType::BF16 || n.input(1)->stored() == DType::BF16;
  if (stored_bf16 && std::string_view(pd.impl_info_str()).starts_with("ref"))
    pd = matmul_pd(n, false);
  return pd;
}

}  // namespace

bool matmul_supports(const ir::Node& n, std::string* why) {
  std::string reason = check_f32_nonempty(n);
  if (reason.empty() && ir::node_precision(n) != ir::Precision::BF16) {
    for (int i = 0; i < 2; ++i)
      if (n.input(i)->stored() == DType::BF16)
        reason =
            fmt::format("{} is stored as bf16 and the node computes in f32", n.input(i)->ref());
  }
  if (reason.empty() && n.inputs().size() > 2 && n.input(2)->stored() == DType::BF16)
    reason = fmt::format("the bias {} is stored as bf16", n.input(2)->ref());
  return supported(std::move(reason), why, [&] { return matmul_pd(n); });
}

ir::Kernel matmul_kernel(const ir::Node& n) {
  return create(n, [&] {
    const dnnl::matmul::primitive_desc pd = matmul_pd(n);
    if (ir::node_precision(n) == ir::Precision::BF16) {
      log_verbose("dispatch", "{}: oneDNN matmul {}", n.describe(), pd.impl_info_str());
      Staged s{dnnl::matmul(pd), n};
      s.add(DNNL_ARG_SRC, factor_desc(n, 0), pd.src_desc(), Args::Side::In, 0);
      s.add(DNNL_ARG_WEIGHTS, factor_desc(n, 1), pd.weights_desc(), Args::Side::In, 1);
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
