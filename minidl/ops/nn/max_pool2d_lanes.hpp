// Shared by max_pool2d.cpp (the portable kernels and the dispatch) and max_pool2d_avx512.cpp (the
// AVX-512 kernels chosen at run time): how a pooling value of any layout is addressed, and the
// arguments of the row kernels.
//
// Each layout a pooling value carries (ir::Value::layout) addresses element (n, c, pos) of its
// [N, C, P] view (P = H*W or OH*OW) as base(n, c) + pos * step: plain (step 1), nChw16c / nChw8c
// (channels in blocks of b innermost: step b) and nhwc (all C channels innermost: step C). The
// layout kernels walk the channels that lie side by side in the input-side value (x, or dx for the
// backward): a "group" of `lanes` channels, b of a block or all C of nhwc, vectorised 16 at a time,
// so every load of that value is contiguous. The output-side values are written (or read) where
// their own layout puts them: contiguous lanes when it is the same layout, else one address per
// lane (pool2 before the flatten writes a plain output from a blocked input).
#pragma once

#include <cstdint>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/native/im2col.hpp"

namespace minidl::ops::pool {

/// The argmax of an output a fused relu clamped to 0 (activation relu): no element of its window
/// receives a gradient, which is relu's mask (the backward needs no relu_bwd before it).
inline constexpr std::int32_t kClamped = -1;

/// A value's addressing.
struct Addr {
  std::int64_t channels = 0, plane = 0, block = 1;  // block: 1 plain, 8 or 16 blocked, C nhwc
  bool nhwc = false;
  std::int64_t step() const { return nhwc ? channels : block; }
  std::int64_t base(std::int64_t n, std::int64_t c) const {
    if (nhwc) return n * channels * plane + c;
    // Plain without a division: kernels that address a lane at a time call this in their loops.
    if (block == 1) return (n * channels + c) * plane;
    return (n * channels + c - c % block) * plane + c % block;
  }
};

inline Addr addr_of(const ir::Value& v, std::int64_t plane) {
  Addr a;
  a.channels = v.shape()[1];
  a.plane = plane;
  a.nhwc = v.layout() == "nhwc";
  a.block = a.nhwc ? a.channels : ir::channel_block(v.layout());
  return a;
}

inline bool same_addr(const Addr& a, const Addr& b) {
  return a.nhwc == b.nhwc && a.block == b.block;
}

/// The forward over a layout: one unit is output row oh of channel group grp (u = grp * OH + oh).
struct FwdArgs {
  native::ConvGeom g;
  std::int64_t groups_per_n = 0;
  Addr x, y, am;
  bool contiguous = false;  // y and argmax in x's layout
  bool relu = false;
};

/// The backward over a layout: one unit is input row ih of channel group grp (u = grp * H + ih).
struct BwdArgs {
  native::ConvGeom g;
  std::int64_t groups_per_n = 0;
  Addr dx, dy, am;
  bool contiguous = false;  // dy and argmax in dx's layout
};

/// Whether this CPU runs the AVX-512 kernels below (AVX-512 F, BW and VL; asked once). The
/// library is built for baseline x86-64, so they are compiled for AVX-512 on their own and
/// chosen at run time; every other CPU runs the portable kernels, with the same bits.
bool avx512_kernels();

/// Makes avx512_kernels() false (true: the portable kernels run on any CPU), so tests can compare
/// the two implementations and benchmarks can time the portable one.
void force_portable(bool portable);

// The AVX-512 kernels. Their results are the portable kernels' bit for bit: taps in row-major
// order with a strict > (the first maximum wins a tie), a NaN wins over numbers (a later NaN
// over an earlier one), the index starts at the window's first element, relu(m) = m > 0 ? m : 0,
// bf16 stored with round to nearest even (a NaN made quiet), gradients 0.0f + dy.

/// FwdArgs units [u0, u1): x and y stored as f32 (float) or bf16 (std::uint16_t).
void fwd_rows_avx512(const FwdArgs& a, const float* src, float* dst, std::int32_t* argmax,
                     std::int64_t u0, std::int64_t u1);
void fwd_rows_avx512(const FwdArgs& a, const float* src, std::uint16_t* dst, std::int32_t* argmax,
                     std::int64_t u0, std::int64_t u1);
void fwd_rows_avx512(const FwdArgs& a, const std::uint16_t* src, float* dst, std::int32_t* argmax,
                     std::int64_t u0, std::int64_t u1);
void fwd_rows_avx512(const FwdArgs& a, const std::uint16_t* src, std::uint16_t* dst,
                     std::int32_t* argmax, std::int64_t u0, std::int64_t u1);

/// BwdArgs units [u0, u1) of windows that do not overlap and have no padding, dy and argmax in
/// dx's layout (a.contiguous); dx and dy stored as f32 (float) or bf16 (std::uint16_t).
void bwd_rows_disjoint_avx512(const BwdArgs& a, float* dst, const float* src,
                              const std::int32_t* argmax, std::int64_t u0, std::int64_t u1);
void bwd_rows_disjoint_avx512(const BwdArgs& a, float* dst, const std::uint16_t* src,
                              const std::int32_t* argmax, std::int64_t u0, std::int64_t u1);
void bwd_rows_disjoint_avx512(const BwdArgs& a, std::uint16_t* dst, const float* src,
                              const std::int32_t* argmax, std::int64_t u0, std::int64_t u1);
void bwd_rows_disjoint_avx512(const BwdArgs& a, std::uint16_t* dst, const std::uint16_t* src,
                              const std::int32_t* argmax, std::int64_t u0, std::int64_t u1);

/// Groups [g0, g1) (grp = n * groups_per_n + group) whose y and argmax are both plain while x is
/// not: each group's outputs are made in x's order and transposed into the plain rows.
void fwd_planes_to_plain_avx512(const FwdArgs& a, const float* src, float* dst,
                                std::int32_t* argmax, std::int64_t g0, std::int64_t g1);
void fwd_planes_to_plain_avx512(const FwdArgs& a, const float* src, std::uint16_t* dst,
                                std::int32_t* argmax, std::int64_t g0, std::int64_t g1);
void fwd_planes_to_plain_avx512(const FwdArgs& a, const std::uint16_t* src, float* dst,
                                std::int32_t* argmax, std::int64_t g0, std::int64_t g1);
void fwd_planes_to_plain_avx512(const FwdArgs& a, const std::uint16_t* src, std::uint16_t* dst,
                                std::int32_t* argmax, std::int64_t g0, std::int64_t g1);

/// Groups [g0, g1) of windows that do not overlap and have no padding, whose dy (f32) and argmax
/// are both plain while dx is not (the gradient after a flatten): dy and argmax are transposed
/// into dx's order group by group.
void bwd_planes_from_plain_avx512(const BwdArgs& a, float* dst, const float* src,
                                  const std::int32_t* argmax, std::int64_t g0, std::int64_t g1);
void bwd_planes_from_plain_avx512(const BwdArgs& a, std::uint16_t* dst, const float* src,
                                  const std::int32_t* argmax, std::int64_t g0, std::int64_t g1);

/// Plain f32, 2x2 windows with stride 2 and no padding, planes [p0, p1): the forward, vectorised
/// over each output row with masked tails (the MNIST CNN's 13 outputs per row fill one vector).
void fwd_plain_2x2_avx512(const native::ConvGeom& g, const float* src, float* dst,
                          std::int32_t* argmax, std::int64_t p0, std::int64_t p1, bool relu);

/// Its backward: every element of dx written once, 0.0f + dy where the argmax of its window names
/// it, else 0 (argmax must lie inside its window, as the forward makes it).
void bwd_plain_2x2_avx512(const native::ConvGeom& g, const float* dy, const std::int32_t* argmax,
                          float* dx, std::int64_t p0, std::int64_t p1);

}  // namespace minidl::ops::pool
