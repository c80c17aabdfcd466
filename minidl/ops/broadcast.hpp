// NumPy-style broadcasting for the binary elementwise ops (add, sub, mul, div, maximum, minimum)
// and expand: shapes are aligned on the right and a dimension of size 1 stretches to the other's.
#pragma once

#include <optional>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/common.hpp"

namespace minidl::ops {

/// The broadcast of a and b, or nothing when a dimension differs and neither is 1.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);

/// Shape rule of the binary broadcasting ops: inputs a and b f32, output their broadcast; fails
/// naming both shapes.
void infer_broadcast(ir::InferCtx& c);

/// How the output's elements map to two inputs' elements. Output dimensions of size 1 are
/// dropped and neighbours in which each input is either stretched or not alike are merged, so
/// [N,C,H,W] + [1,C,1,1] becomes three dimensions and equal shapes one.
struct BroadcastPlan {
  std::vector<std::int64_t> dims;       // merged output dimensions (at least one)
  std::vector<std::int64_t> a_strides;  // a's element stride per merged dimension, 0 stretched
  std::vector<std::int64_t> b_strides;
};
BroadcastPlan broadcast_plan(const Shape& a, const Shape& b, const Shape& y);

/// y[i] = f(a[.], b[.]) over the plan; rows of the last merged dimension run in parallel.
template <typename F>
void broadcast_apply(const BroadcastPlan& p, const float* a, const float* b, float* y, F f) {
  const int r = static_cast<int>(p.dims.size());
  const std::int64_t inner = p.dims[r - 1];
  const std::int64_t sa = p.a_strides[r - 1], sb = p.b_strides[r - 1];
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < r; ++d) rows *= p.dims[d];
  parallel_for(rows, inner, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t row = r0; row < r1; ++row) {
      std::int64_t oa = 0, ob = 0;
      for (std::int64_t d = r - 2, rem = row; d >= 0; --d) {
        const std::int64_t i = rem % p.dims[d];
        rem /= p.dims[d];
        oa += i * p.a_strides[d];
        ob += i * p.b_strides[d];
      }
      const float* pa = a + oa;
      const float* pb = b + ob;
      float* py = y + row * inner;
      // The last merged dimension is contiguous in an input or stretched (stride 1 or 0).
      if (sa == 1 && sb == 1) {
#pragma omp simd
        for (std::int64_t j = 0; j < inner; ++j) py[j] = f(pa[j], pb[j]);
      } else if (sa == 1) {
        const float vb = *pb;
#pragma omp simd
        for (std::int64_t j = 0; j < inner; ++j) py[j] = f(pa[j], vb);
      } else if (sb == 1) {
        const float va = *pa;
#pragma omp simd
        for (std::int64_t j = 0; j < inner; ++j) py[j] = f(va, pb[j]);
      } else {
        for (std::int64_t j = 0; j < inner; ++j) py[j] = f(pa[j * sa], pb[j * sb]);
      }
    }
  });
}

/// out = f(in0, in1) with broadcasting; equal shapes take map_binary's flat loop.
template <typename F>
void map_broadcast(const ir::KernelArgs& k, F f) {
  if (k.in[0].shape() == k.in[1].shape()) return map_binary(k, f);
  broadcast_apply(broadcast_plan(k.in[0].shape(), k.in[1].shape(), k.out[0].shape()),
                  k.in[0].data<float>(), k.in[1].data<float>(), k.out[0].data<float>(), f);
}

/// Backward of a binary selection (maximum, minimum): dy, a, b -> da, db, both of dy's (the
/// broadcast) shape; da is dy where pick_a(a, b) holds and 0 elsewhere, db the rest.
template <typename Pick>
void select_bwd(const ir::KernelArgs& k, Pick pick_a) {
  const Tensor &dy = k.in[0], &a = k.in[1], &b = k.in[2];
  float* da = k.out[0].data<float>();
  float* db = k.out[1].data<float>();
  broadcast_apply(broadcast_plan(a.shape(), b.shape(), dy.shape()), a.data<float>(),
                  b.data<float>(), da,
                  [pick_a](float x, float y) { return pick_a(x, y) ? 1.0f : 0.0f; });
  const float* g = dy.data<float>();
  elementwise(dy.numel(), [&](std::int64_t lo, std::int64_t hi) {
#pragma omp simd
    for (std::int64_t i = lo; i < hi; ++i) {
      const bool to_a = da[i] != 0.0f;
      da[i] = to_a ? g[i] : 0.0f;
      db[i] = to_a ? 0.0f : g[i];
    }
  });
}
/// Shape rule of select_bwd's ops: dy, a, b with broadcast(a, b) == dy -> da, db like dy.
void infer_select_bwd(ir::InferCtx& c);

/// Gradient rule of maximum and minimum through their backward op `bwd` (ties go to a).
void select_grad(ir::GradCtx& g, const ir::OpDef& bwd);

/// Inside a gradient rule: grad (of a broadcast output's shape) summed over the dimensions that
/// broadcasting stretched or added, then reshaped to target; grad itself when the shapes match.
ir::Value* reduce_to(ir::GradCtx& g, ir::Value* grad, const Shape& target);

}  // namespace minidl::ops
