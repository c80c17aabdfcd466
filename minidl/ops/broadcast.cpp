#include "minidl/ops/broadcast.hpp"

#include "minidl/ops/op_table.hpp"

namespace minidl::ops {

std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  const int r = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> dims(static_cast<std::size_t>(r));
  for (int d = 0; d < r; ++d) {
    const int da = d - (r - a.rank()), db = d - (r - b.rank());
    const std::int64_t x = da >= 0 ? a[da] : 1, y = db >= 0 ? b[db] : 1;
    if (x != y && x != 1 && y != 1) return std::nullopt;
    dims[static_cast<std::size_t>(d)] = x == 1 ? y : x;
  }
  return Shape(std::move(dims));
}

void infer_broadcast(ir::InferCtx& c) {
  for (int i = 0; i < 2; ++i)
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32, got ", c.dtype(i));
  if (c.input(0) == c.input(1)) return c.set_output(0, c.input(0));
  const std::optional<Shape> y = broadcast_shapes(c.input(0), c.input(1));
  MINIDL_CHECK_NODE(c, y.has_value(), "cannot broadcast ", c.input(0), " with ", c.input(1),
                    " (dimensions aligned on the right must be equal or 1)");
  c.set_output(0, *y);
}

BroadcastPlan broadcast_plan(const Shape& a, const Shape& b, const Shape& y) {
  BroadcastPlan p;
  std::vector<bool> a_stretched, b_stretched;
  const int r = y.rank();
  for (int d = 0; d < r; ++d) {
    if (y[d] == 1) continue;
    const int da = d - (r - a.rank()), db = d - (r - b.rank());
    const bool sa = da < 0 || a[da] == 1, sb = db < 0 || b[db] == 1;
    if (!p.dims.empty() && a_stretched.back() == sa && b_stretched.back() == sb) {
      p.dims.back() *= y[d];
      continue;
    }
    p.dims.push_back(y[d]);
    a_stretched.push_back(sa);
    b_stretched.push_back(sb);
  }
  if (p.dims.empty()) {  // a single element
    p.dims = {1};
    a_stretched = b_stretched = {true};
  }
  const std::size_t n = p.dims.size();
  p.a_strides.assign(n, 0);
  p.b_strides.assign(n, 0);
  std::int64_t ra = 1, rb = 1;
  for (std::size_t i = n; i-- > 0;) {
    if (!a_stretched[i]) {
      p.a_strides[i] = ra;
      ra *= p.dims[i];
    }
    if (!b_stretched[i]) {
      p.b_strides[i] = rb;
      rb *= p.dims[i];
    }
  }
  return p;
}

void infer_select_bwd(ir::InferCtx& c) {
  for (int i = 0; i < 3; ++i)
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32, got ", c.dtype(i));
  const std::optional<Shape> y = broadcast_shapes(c.input(1), c.input(2));
  MINIDL_CHECK_NODE(c, y.has_value() && *y == c.input(0), "dy must have the broadcast shape of ",
                    c.input(1), " and ", c.input(2), ", got ", c.input(0));
  c.set_output(0, c.input(0));
  c.set_output(1, c.input(0));
}

void select_grad(ir::GradCtx& g, const ir::OpDef& bwd) {
  const bool da = g.needs_input_grad(0), db = g.needs_input_grad(1);
  if (!da && !db) return;
  ir::Value* da_full = g.op(bwd, {g.out_grad(0), g.input(0), g.input(1)});
  if (da) g.set_input_grad(0, reduce_to(g, da_full, g.input(0)->shape()));
  if (db) g.set_input_grad(1, reduce_to(g, da_full->producer()->output(1), g.input(1)->shape()));
}

ir::Value* reduce_to(ir::GradCtx& g, ir::Value* grad, const Shape& target) {
  const Shape& s = grad->shape();
  if (s == target) return grad;
  ir::Ints axes;
  const int extra = s.rank() - target.rank();
  for (int d = 0; d < s.rank(); ++d)
    if (d < extra || (target[d - extra] == 1 && s[d] != 1)) axes.push_back(d);
  if (!axes.empty()) grad = g.op(op_sum, {grad}, {{"axes", axes}});
  if (grad->shape() != target) grad = g.op(op_reshape, {grad}, {{"shape", target.dims()}});
  return grad;
}

}  // namespace minidl::ops
