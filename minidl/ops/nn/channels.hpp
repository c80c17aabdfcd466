// Shared by the BatchNorm ops: per-channel walks over an activation x [N,C] or [N,C,H,W] in its
// layout (plain, or channel-blocked nChw16c / nChw8c, ir::Value::layout), and sums over every
// element of a channel whose bits do not depend on the thread count.
#pragma once

#include <algorithm>
#include <vector>

#include "minidl/core/threading.hpp"
#include "minidl/ir/graph.hpp"

namespace minidl::ops {

/// In a shape rule: input i (called `what` in errors) is a non-empty f32 activation [N,C] or
/// [N,C,H,W]; returns C.
inline std::int64_t check_activation(ir::InferCtx& c, int i, const char* what) {
  const Shape& x = c.input(i);
  MINIDL_CHECK_NODE(c, x.rank() == 2 || x.rank() == 4, "expected ", what,
                    " [N,C] or [N,C,H,W], got rank ", x.rank());
  MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "expected f32 ", what, ", got ", c.dtype(i));
  MINIDL_CHECK_NODE(c, x.numel() > 0, "expected a non-empty ", what);
  return x[1];
}

/// x seen as [N, CB, S, B]: channel c = cb * B + ci, element (n, c, s) at ((n * CB + cb) * S + s)
/// * B + ci. One formula for the three cases:
///   plain [N,C,H,W]:  CB = C,     S = H*W, B = 1
///   blocked:          CB = C / B, S = H*W, B = 16 or 8
///   [N,C]:            CB = 1,     S = 1,   B = C (a row holds every channel side by side)
struct ChannelGeom {
  std::int64_t N = 0, CB = 0, S = 0, B = 0;
  std::int64_t channels() const { return CB * B; }
  /// Elements per channel: N * S.
  std::int64_t count() const { return N * S; }
  /// Offset of the first element of (n, cb); the (s, ci) element is at + s * B + ci.
  std::int64_t group(std::int64_t n, std::int64_t cb) const { return (n * CB + cb) * S * B; }
  /// Offset of element (n, c, s).
  std::int64_t at(std::int64_t n, std::int64_t c, std::int64_t s) const {
    return ((n * CB + c / B) * S + s) * B + c % B;
  }
  bool operator==(const ChannelGeom&) const = default;
};

/// The geometry of a plain activation of shape s ([N,C] or [N,C,H,W]).
inline ChannelGeom channel_geom_plain(const Shape& s) {
  if (s.rank() == 2) return {s[0], 1, 1, s[1]};
  return {s[0], s[1], s[2] * s[3], 1};
}

/// The geometry of activation value v (shape [N,C] or [N,C,H,W]) in its layout.
inline ChannelGeom channel_geom(const ir::Value* v) {
  const Shape& s = v->shape();
  const std::int64_t block = ir::channel_block(v->layout());
  if (s.rank() == 2 || block == 1) return channel_geom_plain(s);
  return {s[0], s[1] / block, s[2] * s[3], block};
}

/// How many chunks of samples the per-channel sums use: a function of the shape only, so the
/// order of the additions (chunks summed in order) never depends on the threads.
inline std::int64_t sample_chunks(const ChannelGeom& g) {
  constexpr std::int64_t kMaxChunks = 16, kMinElements = 4096;
  const std::int64_t per_sample = std::max<std::int64_t>(1, g.S * g.B);
  return std::clamp<std::int64_t>(g.N * per_sample / kMinElements, 1, std::min(g.N, kMaxChunks));
}

/// For every channel c, the sums over its N * S elements of what term(e, c, acc) adds to its
/// `terms` double accumulators acc[0..terms) (e the element's offset in x): out[k * C + c].
/// Samples are cut into sample_chunks(g) chunks; each (chunk, channel group) is walked in one
/// fixed order by one thread into `partial` (resized here), then the chunks are added in order.
template <int terms, typename Term>
void channel_sums(const ChannelGeom& g, std::vector<double>& partial, double* out, Term term) {
  constexpr std::int64_t kMaxLocalBlock = 16;
  const std::int64_t C = g.channels(), chunks = sample_chunks(g);
  partial.assign(static_cast<std::size_t>(chunks * C * terms), 0.0);  // [chunk][C][terms]
  const std::int64_t cost = g.N / chunks * g.S * g.B;
  parallel_for(chunks * g.CB, cost, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t j = i / g.CB, cb = i % g.CB;
      const std::int64_t n0 = g.N * j / chunks, n1 = g.N * (j + 1) / chunks;
      double* acc = partial.data() + (j * C + cb * g.B) * terms;
      if (g.B > 1 && g.B <= kMaxLocalBlock) {
        // A channel block: its accumulators in a local array the compiler can keep in
        // registers, walked in the same order as below (the same bits).
        double local[kMaxLocalBlock * terms] = {};
        for (std::int64_t n = n0; n < n1; ++n) {
          const std::int64_t base = g.group(n, cb);
          for (std::int64_t s = 0; s < g.S; ++s) {
            const std::int64_t e = base + s * g.B;
            for (std::int64_t ci = 0; ci < g.B; ++ci)
              term(e + ci, cb * g.B + ci, local + ci * terms);
          }
        }
        std::copy(local, local + g.B * terms, acc);
        continue;
      }
      for (std::int64_t n = n0; n < n1; ++n) {
        const std::int64_t base = g.group(n, cb);
        if (g.B == 1) {
          // A plain plane: its own sums first, then added to the channel's.
          double part[terms] = {};
          for (std::int64_t s = 0; s < g.S; ++s) term(base + s, cb, part);
          for (int k = 0; k < terms; ++k) acc[k] += part[k];
          continue;
        }
        for (std::int64_t s = 0; s < g.S; ++s) {
          const std::int64_t e = base + s * g.B;
          for (std::int64_t ci = 0; ci < g.B; ++ci) term(e + ci, cb * g.B + ci, acc + ci * terms);
        }
      }
    }
  });
  for (std::int64_t c = 0; c < C; ++c) {
    for (int k = 0; k < terms; ++k) {
      double s = 0.0;
      for (std::int64_t j = 0; j < chunks; ++j) s += partial[(j * C + c) * terms + k];
      out[k * C + c] = s;
    }
  }
}

/// channel_sums where `group(n, cb, acc)` adds the S * B elements of (n, cb) to
/// acc[ci * terms + k] (ci < B): the same chunks and the same order of the chunks and groups as
/// channel_sums, but a whole group per call, which a kernel can vectorise across the block's
/// channels (B > 1: the same bits as channel_sums' walk of s in order) or along a plain plane
/// (B = 1, in an order of its own that depends on the shape only).
template <int terms, typename Group>
void channel_block_sums(const ChannelGeom& g, std::vector<double>& partial, double* out,
                        Group group) {
  const std::int64_t C = g.channels(), chunks = sample_chunks(g);
  partial.assign(static_cast<std::size_t>(chunks * C * terms), 0.0);  // [chunk][C][terms]
  const std::int64_t cost = g.N / chunks * g.S * g.B;
  parallel_for(chunks * g.CB, cost, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t j = i / g.CB, cb = i % g.CB;
      const std::int64_t n0 = g.N * j / chunks, n1 = g.N * (j + 1) / chunks;
      double* acc = partial.data() + (j * C + cb * g.B) * terms;
      for (std::int64_t n = n0; n < n1; ++n) group(n, cb, acc);
    }
  });
  for (std::int64_t c = 0; c < C; ++c) {
    for (int k = 0; k < terms; ++k) {
      double s = 0.0;
      for (std::int64_t j = 0; j < chunks; ++j) s += partial[(j * C + c) * terms + k];
      out[k * C + c] = s;
    }
  }
}

/// e: an offset valid in every geometry of a walk whose layouts agree.
inline std::int64_t offset_as(const ChannelGeom&, std::int64_t e) { return e; }

/// Calls fn(c, e0, e1, ...) for every element (n, c, s) of same-shaped activations, e_i its
/// offset in the i-th (each in its own layout), in parallel. Where all layouts agree the offsets
/// are one, walked contiguously.
template <typename Fn, typename... Geoms>
void for_each_element(Fn&& fn, const ChannelGeom& g, const Geoms&... others) {
  if ((... && (others == g))) {
    parallel_for(g.N * g.CB, g.S * g.B, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        const std::int64_t cb = i % g.CB, base = i * g.S * g.B;
        if (g.B == 1) {
#pragma omp simd
          for (std::int64_t e = base; e < base + g.S; ++e) fn(cb, e, offset_as(others, e)...);
          continue;
        }
        for (std::int64_t s = 0; s < g.S; ++s) {
          const std::int64_t e0 = base + s * g.B;
#pragma omp simd
          for (std::int64_t ci = 0; ci < g.B; ++ci)
            fn(cb * g.B + ci, e0 + ci, offset_as(others, e0 + ci)...);
        }
      }
    });
    return;
  }
  const std::int64_t C = g.channels();
  parallel_for(g.N * C, g.S, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const std::int64_t n = i / C, c = i % C;
      for (std::int64_t s = 0; s < g.S; ++s) fn(c, g.at(n, c, s), others.at(n, c, s)...);
    }
  });
}

}  // namespace minidl::ops
