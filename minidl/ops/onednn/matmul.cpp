// oneDNN matmul for the matmul op. The transposes are strides in the memory descriptors, so
// trans_a / trans_b read the stored operands in place.
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
  const dnnl::matmul::desc d(matrix_desc(m, k, ta), matrix_desc(k, cols, tb),
                             matrix_desc(m, cols, false));
  return dnnl::matmul::primitive_desc(d, engine());
}

}  // namespace

bool matmul_supports(const ir::Node& n, std::string* why) {
  std::string reason = check_f32_nonempty(n);
  if (reason.empty()) {
    try {
      (void)matmul_pd(n);
    } catch (const dnnl::error& e) {
      reason = describe(e);
    }
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

ir::Kernel matmul_kernel(const ir::Node& n) {
  return create(n, [&] {
    const dnnl::matmul::primitive_desc pd = matmul_pd(n);
    Args args;
    args.add(DNNL_ARG_SRC, pd.src_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_WEIGHTS, pd.weights_desc(), Args::Side::In, 1);
    args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::matmul(pd), std::move(args));
  });
}

}  // namespace minidl::ops::onednn
