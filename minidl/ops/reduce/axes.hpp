// What the reductions over chosen axes (sum, mean, max and max_bwd) share: the `axes` and
// `keepdim` attributes, the output shape, and a traversal that visits each output's elements in
// one fixed order whatever the thread count.
#pragma once

#include <algorithm>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/common.hpp"

namespace minidl::ops {

/// Which of x's dimensions are reduced: `axes` (negative counts from the end; empty: all).
/// Fails naming the node for an axis out of range or given twice.
std::vector<bool> reduced_axes(ir::InferCtx& c, const Shape& x);
/// The same after shape inference has validated the attributes.
std::vector<bool> reduced_axes(const ir::Attrs& attrs, const Shape& x);
/// x without its reduced dimensions, or with them as 1 when keepdim.
Shape reduced_shape(const Shape& x, const std::vector<bool>& reduced, bool keepdim);

/// x's elements grouped by output: outputs in row-major order of the kept dimensions, each
/// output's elements in row-major order of the reduced ones. Neighbouring dimensions of the same
/// kind are merged, which keeps both orders.
struct ReducePlan {
  std::vector<std::int64_t> row_dims, row_strides;  // kept dimensions but a contiguous last one
  std::int64_t inner = 1;                           // the contiguous last kept dimension, or 1
  std::vector<std::int64_t> red_dims, red_strides;  // reduced dimensions
  std::int64_t rows = 1, count = 1;                 // row count, elements per output
};
ReducePlan reduce_plan(const Shape& x, const std::vector<bool>& reduced);

/// For every output o (row-major, o < rows * inner): acc = init, then add(acc, offset) for
/// each of o's elements in the fixed order, then done(o, acc). Outputs are split among threads;
/// each is reduced by one thread, so its result does not depend on the thread count. Blocks of
/// outputs along the contiguous last dimension are reduced together, to read x row by row.
template <typename Acc, typename Add, typename Done>
void reduce_each(const ReducePlan& p, Acc init, Add add, Done done) {
  constexpr std::int64_t kBlock = 64;
  const std::int64_t blocks = (p.inner + kBlock - 1) / kBlock;
  const int nr = static_cast<int>(p.red_dims.size());
  parallel_for(
      p.rows * blocks, p.count * std::min(p.inner, kBlock), [&](std::int64_t t0, std::int64_t t1) {
        Acc acc[kBlock];
        std::vector<std::int64_t> idx(static_cast<std::size_t>(nr));
        for (std::int64_t t = t0; t < t1; ++t) {
          const std::int64_t row = t / blocks, j0 = (t % blocks) * kBlock;
          const std::int64_t width = std::min(kBlock, p.inner - j0);
          std::int64_t base = j0;
          for (std::int64_t d = static_cast<std::int64_t>(p.row_dims.size()) - 1, rem = row; d >= 0;
               --d) {
            base += (rem % p.row_dims[d]) * p.row_strides[d];
            rem /= p.row_dims[d];
          }
          std::fill_n(acc, width, init);
          std::fill(idx.begin(), idx.end(), 0);
          // An odometer over the reduced dimensions, the last one innermost.
          const std::int64_t last = nr > 0 ? p.red_dims[nr - 1] : 1;
          const std::int64_t last_stride = nr > 0 ? p.red_strides[nr - 1] : 0;
          for (std::int64_t off = base;;) {
            for (std::int64_t i = 0; i < last; ++i) {
              const std::int64_t o = off + i * last_stride;
              for (std::int64_t j = 0; j < width; ++j) add(acc[j], o + j);
            }
            int d = nr - 2;
            for (; d >= 0; --d) {
              off += p.red_strides[d];
              if (++idx[d] < p.red_dims[d]) break;
              off -= idx[d] * p.red_strides[d];
              idx[d] = 0;
            }
            if (d < 0) break;
          }
          for (std::int64_t j = 0; j < width; ++j) done(row * p.inner + j0 + j, acc[j]);
        }
      });
}

}  // namespace minidl::ops
