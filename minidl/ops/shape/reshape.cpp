// reshape and flatten: the same data under another shape. Outputs alias their input's buffer,
// so no kernel runs and no copy is made.
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer_reshape(ir::InferCtx& c) {
  auto dims = c.attr<ir::Ints>("shape");
  const std::int64_t n = c.input(0).numel();
  int infer_at = -1;
  std::int64_t known = 1;
  for (int i = 0; i < static_cast<int>(dims.size()); ++i) {
    if (dims[i] == -1) {
      MINIDL_CHECK_NODE(c, infer_at < 0, "at most one dimension may be -1, got ", Shape(dims));
      infer_at = i;
    } else {
      MINIDL_CHECK_NODE(c, dims[i] > 0, "dimensions must be positive or -1, got ", Shape(dims));
      known *= dims[i];
    }
  }
  if (infer_at >= 0) {
    MINIDL_CHECK_NODE(c, n % known == 0, "cannot reshape ", n, " elements to ", Shape(dims));
    dims[infer_at] = n / known;
  }
  MINIDL_CHECK_NODE(c, Shape(dims).numel() == n, "cannot reshape ", n, " elements to ",
                    Shape(dims));
  c.set_output(0, Shape(dims), c.dtype(0));
}

void infer_flatten(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  const int start = static_cast<int>(c.attr<std::int64_t>("start_dim"));
  MINIDL_CHECK_NODE(c, start >= 0 && start < x.rank(), "start_dim ", start,
                    " is out of range for rank ", x.rank());
  std::vector<std::int64_t> dims(x.dims().begin(), x.dims().begin() + start);
  std::int64_t rest = 1;
  for (int i = start; i < x.rank(); ++i) rest *= x[i];
  dims.push_back(rest);
  c.set_output(0, Shape(dims), c.dtype(0));
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_reshape, {g.out_grad(0)}, {{"shape", g.input(0)->shape().dims()}}));
}

}  // namespace

MINIDL_OP(reshape)
    .inputs({"x"})
    .attr<ir::Ints>("shape")
    .infer(infer_reshape)
    .alias(0, 0)
    .grad(grad);

MINIDL_OP(flatten)
    .inputs({"x"})
    .attr<int>("start_dim", 1)
    .infer(infer_flatten)
    .alias(0, 0)
    .grad(grad);

}  // namespace minidl::ops
