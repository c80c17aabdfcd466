// oneDNN binary for add, sub, mul, div, maximum and minimum with NumPy broadcasting: b (src_1)
// may be broadcast, a (src_0) must already have the output's shape, as oneDNN 2.6 requires; the
// native kernel takes the other cases. Both are padded to the output's rank with leading 1s.
#include "minidl/ops/common.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

using dnnl::algorithm;

// s as a plain descriptor of rank `rank`, leading dimensions of size 1 added.
dnnl::memory::desc padded_desc(const Shape& s, int rank) {
  std::vector<std::int64_t> dims(static_cast<std::size_t>(rank - s.rank()), 1);
  dims.insert(dims.end(), s.dims().begin(), s.dims().end());
  return plain_desc(Shape(std::move(dims)));
}

// A node with an `activation` attribute (add) of relu applies it as an eltwise post-op, the
// algorithm and alpha of the relu kernel, so the fused node has the unfused pair's bits.
ir::Kernel binary(const ir::Node& n, algorithm alg) {
  return create(n, [&] {
    const Shape& y = n.output(0)->shape();
    const int rank = std::max(1, y.rank());
    dnnl::primitive_attr attr;
    if (n.attrs().has("activation") && activation_of(n.attrs()) == Activation::Relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(ops);
    }
    const dnnl::binary::primitive_desc pd(
        dnnl::binary::desc(alg, padded_desc(n.input(0)->shape(), rank),
                           padded_desc(n.input(1)->shape(), rank), padded_desc(y, rank)),
        attr, engine());
    Args args;
    args.add(DNNL_ARG_SRC_0, pd.src0_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_SRC_1, pd.src1_desc(), Args::Side::In, 1);
    args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::binary(pd), std::move(args));
  });
}

}  // namespace

bool binary_supports(const ir::Node& n, std::string* why) {
  std::string reason = check_f32_nonempty(n);
  const Shape& a = n.input(0)->shape();
  const Shape& y = n.output(0)->shape();
  if (reason.empty() && a.numel() != y.numel()) {
    reason = fmt::format("a {} is broadcast to {}; oneDNN broadcasts only b", a, y);
  } else if (reason.empty() && y.rank() > DNNL_MAX_NDIMS) {
    reason = fmt::format("rank {} exceeds oneDNN's {}", y.rank(), DNNL_MAX_NDIMS);
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

ir::Kernel add_kernel(const ir::Node& n) { return binary(n, algorithm::binary_add); }
ir::Kernel sub_kernel(const ir::Node& n) { return binary(n, algorithm::binary_sub); }
ir::Kernel mul_kernel(const ir::Node& n) { return binary(n, algorithm::binary_mul); }
ir::Kernel div_kernel(const ir::Node& n) { return binary(n, algorithm::binary_div); }
ir::Kernel maximum_kernel(const ir::Node& n) { return binary(n, algorithm::binary_max); }
ir::Kernel minimum_kernel(const ir::Node& n) { return binary(n, algorithm::binary_min); }

}  // namespace minidl::ops::onednn
