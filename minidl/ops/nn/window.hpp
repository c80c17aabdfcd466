// Shared by conv2d, max_pool2d and avg_pool2d: the attributes and checked geometry of a 2-D
// sliding window over x [N,C,H,W].
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/native/im2col.hpp"

namespace minidl::ops {

using Int2 = std::array<std::int64_t, 2>;

/// "[1,2]", for error messages.
inline std::string ints_str(const ir::Ints& v) { return fmt::format("[{}]", fmt::join(v, ",")); }

/// The two values of Ints attribute `name` (kernel, stride, pad), each at least `min`.
inline Int2 int2_attr(const ir::InferCtx& c, std::string_view name, std::int64_t min) {
  const auto v = c.attr<ir::Ints>(name);
  MINIDL_CHECK_NODE(c, v.size() == 2, name, " must hold 2 values [H,W], got ", ints_str(v));
  MINIDL_CHECK_NODE(c, v[0] >= min && v[1] >= min, name, " must be ",
                    min > 0 ? "positive" : "non-negative", ", got ", ints_str(v));
  return {v[0], v[1]};
}

/// Whether v is the argmax of a max_pool2d with a fused relu, which marks each output the relu
/// clamped with -1 (pool::kClamped): a backward routing dy through it masks dy as relu_bwd does.
inline bool argmax_masks_relu(const ir::Value* v) {
  const ir::Node* pool = v->producer();
  return pool->op() == "max_pool2d" && pool->outputs().size() > 1 && pool->output(1) == v &&
         pool->attrs().get<std::string>("activation") == "relu";
}

/// A pooling's stride: its `stride` attribute, or the kernel when that is empty. `prefix` names
/// the attributes (prefix + "kernel", "stride", "pad"): "pool_" for the pooling a fused op holds.
inline ir::Ints pool_stride(const ir::Attrs& a, std::string_view prefix = "") {
  const std::string p(prefix);
  auto s = a.get<ir::Ints>(p + "stride");
  return s.empty() ? a.get<ir::Ints>(p + "kernel") : s;
}

/// The geometry of a kh x kw window over x [N,C,H,W]; no checks (kernels use it on nodes whose
/// shape rule has passed).
inline native::ConvGeom window_geom(const Shape& x, std::int64_t kh, std::int64_t kw,
                                    const ir::Ints& stride, const ir::Ints& pad) {
  native::ConvGeom g;
  g.C = x[1], g.H = x[2], g.W = x[3];
  g.KH = kh, g.KW = kw;
  g.SH = stride[0], g.SW = stride[1];
  g.PH = pad[0], g.PW = pad[1];
  g.OH = native::window_out_size(g.H, kh, g.SH, g.PH);
  g.OW = native::window_out_size(g.W, kw, g.SW, g.PW);
  return g;
}

/// Same, checked in a shape rule: stride positive, pad non-negative, the window inside the
/// padded input. Errors name the node and its input shapes.
inline native::ConvGeom checked_window_geom(const ir::InferCtx& c, const Shape& x, Int2 kernel,
                                            Int2 stride, Int2 pad) {
  MINIDL_CHECK_NODE(c, x.rank() == 4, "expected 4-D input [N,C,H,W], got ", x);
  const std::int64_t ph = x[2] + 2 * pad[0], pw = x[3] + 2 * pad[1];
  MINIDL_CHECK_NODE(c, kernel[0] <= ph && kernel[1] <= pw, "kernel ", kernel[0], "x", kernel[1],
                    " exceeds padded input ", ph, "x", pw);
  return window_geom(x, kernel[0], kernel[1], {stride[0], stride[1]}, {pad[0], pad[1]});
}

/// A pooling's geometry over x, checked: kernel positive, stride positive or empty (the kernel),
/// pad non-negative and at most half the kernel (PyTorch's rule, so every window holds at least
/// one input element), the window inside the padded input. `prefix` as pool_stride's.
inline native::ConvGeom checked_pool_geom(const ir::InferCtx& c, const Shape& x,
                                          std::string_view prefix = "") {
  MINIDL_CHECK_NODE(c, x.rank() == 4, "expected 4-D input [N,C,H,W], got ", x);
  const std::string k = std::string(prefix) + "kernel", s = std::string(prefix) + "stride",
                    p = std::string(prefix) + "pad";
  const Int2 kernel = int2_attr(c, k, 1);
  const Int2 stride = c.attr<ir::Ints>(s).empty() ? kernel : int2_attr(c, s, 1);
  const Int2 pad = int2_attr(c, p, 0);
  MINIDL_CHECK_NODE(c, 2 * pad[0] <= kernel[0] && 2 * pad[1] <= kernel[1], p, " ",
                    ints_str({pad[0], pad[1]}), " exceeds half the ", k, " ", kernel[0], "x",
                    kernel[1]);
  return checked_window_geom(c, x, kernel, stride, pad);
}

/// A pooling's geometry over x (unchecked, for kernels). `prefix` as pool_stride's.
inline native::ConvGeom pool_geom(const Shape& x, const ir::Attrs& a,
                                  std::string_view prefix = "") {
  const std::string p(prefix);
  const auto kernel = a.get<ir::Ints>(p + "kernel");
  return window_geom(x, kernel[0], kernel[1], pool_stride(a, prefix), a.get<ir::Ints>(p + "pad"));
}

/// The output [N,C,OH,OW] of a window op with geometry g over x.
inline Shape window_out_shape(const Shape& x, std::int64_t channels, const native::ConvGeom& g) {
  return Shape{x[0], channels, g.OH, g.OW};
}

}  // namespace minidl::ops
