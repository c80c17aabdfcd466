// oneDNN reduction for max over axes: src x -> dst y, y described with the reduced dimensions as
// 1 (keepdim or not, the same data). Only max: a maximum is exact in any order, whereas
// oneDNN's sum and mean may combine partial sums in an order that depends on the thread count,
// so sum and mean keep their fixed-order native kernels.
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"
#include "minidl/ops/reduce/axes.hpp"

namespace minidl::ops::onednn {

bool max_supports(const ir::Node& n, std::string* why) {
  std::string reason = check_f32_nonempty(n);
  const Shape& x = n.input(0)->shape();
  if (reason.empty() && x.rank() > DNNL_MAX_NDIMS) {
    reason = fmt::format("rank {} exceeds oneDNN's {}", x.rank(), DNNL_MAX_NDIMS);
  } else if (reason.empty() && n.output(0)->shape().numel() == x.numel()) {
    reason = "nothing is reduced (every reduced dimension has size 1)";
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}

ir::Kernel max_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Shape& x = n.input(0)->shape();
    const Shape kept = reduced_shape(x, reduced_axes(n.attrs(), x), true);
    const dnnl::reduction::primitive_desc pd(
        dnnl::reduction::desc(dnnl::algorithm::reduction_max, plain_desc(x), plain_desc(kept), 0.0f,
                              0.0f),
        engine());
    Args args;
    args.add(DNNL_ARG_SRC, pd.src_desc(), Args::Side::In, 0);
    args.add(DNNL_ARG_DST, pd.dst_desc(), Args::Side::Out, 0);
    return primitive_kernel(dnnl::reduction(pd), std::move(args));
  });
}

}  // namespace minidl::ops::onednn
