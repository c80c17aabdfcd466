// The weight gradient of a stride-1 convolution on AMX tiles (amx_bf16.hpp):
//   dw[k][c][r][s] = sum over n, oh, ow of dy[n][k][oh][ow] * x[n][c][oh - PH + r][ow - PW + s]
// as one product per sample, C [rows (c, r, s)][K] += A [rows][positions] B [positions][K], its
// sum running along the output positions. The positions are those of the padded width: position
// t = oh * WP + ow with ow < WP = W + 2 PW, so that row (c, r, s) of A is the run of channel c's
// zero-padded plane [H + 2 PH][WP] (bf16) starting at r * WP + s: A is read from the planes in
// place when the channels fill tiles (C a multiple of 16, a tile being 16 channels at one (r, s),
// 16 rows one plane apart), or copied run by run into rows of its own otherwise (the CIFAR CNN's
// 3-channel first layer: 27 rows). B is dy in pairs of positions, zero at the WP - OW padding
// columns (so what A holds there never counts, unless it is an Inf or a NaN of the input, which
// spoils the step's gradient anyway). The extra columns cost (WP - OW) / OW of the products: an
// eighth for a 3x3 window on 16 columns. The positions go in segments whose packs stay in the
// first-level cache.
//
// oneDNN 2.6's bf16 weight gradients for the CIFAR CNN ran at 157 GFLOP/s for its first layer
// (3 channels) and 806 for its second (32 channels, 16x16) on an Intel Xeon with AMX, against
// 2579 for the second layer's forward.
#pragma once

#include <cstdint>

#include "minidl/ops/native/conv_bf16.hpp"
#include "minidl/ops/native/im2col.hpp"

namespace minidl::native {

/// Floats of per-thread scratch conv_amx_bwd_weights needs for geometry g with K filters.
std::int64_t conv_amx_scratch_floats(const ConvGeom& g, std::int64_t K);

/// conv_bf16_bwd_weights's contract on AMX tiles: the sum over samples [n0, n1) into acc
/// [C*KH*KW][K] (overwritten; rows in (c, r, s) order, n1 > n0), and the sum of dy over positions
/// added to bias_acc [K] when it is not null. g.SH = g.SW = 1, K % 16 == 0, amx_bf16_unavailable()
/// empty; `scratch` holds conv_amx_scratch_floats(g, K) floats. Each element's
/// terms are added in an order fixed by the shapes: samples, then runs of 32 positions.
void conv_amx_bwd_weights(const ConvGeom& g, std::int64_t K, const void* dy, ActLayout dy_layout,
                          const void* x, ActLayout x_layout, std::int64_t n0, std::int64_t n1,
                          float* acc, float* bias_acc, float* scratch);

/// conv_amx_bwd_weights on the pooling's gradient as PooledGrad says: the same sums, in the same
/// order, as conv_amx_bwd_weights on the pooling's backward's result, which is never written.
void conv_amx_bwd_weights_pooled(const ConvGeom& g, std::int64_t K, const PooledGrad& dy,
                                 const void* x, ActLayout x_layout, std::int64_t n0,
                                 std::int64_t n1, float* acc, float* bias_acc, float* scratch);

}  // namespace minidl::native

namespace minidl::native {

// ---- the forward and the data gradient, on AMX tiles --------------------------------------------
// y[n][k][oh][ow] = sum over c, r, s of x[n][c][oh - PH + r][ow - PW + s] w[k][c][r][s] (stride 1),
// one product per output row: C [16 positions][16 filters] += A [16 positions][32] B [32][16
// filters], A's rows the runs of the zero-padded input row oh + r in nhwc order, which hold
// (s, c) side by side: position ow's run starts C values after ow - 1's, so one tile load reads
// 16 positions' runs in place (rows 2 C bytes apart), in steps of 32 values over the KW * C of a
// window row, whatever comes after it multiplied by zero weights. The weights are packed per call
// into pairs along (s, c). The data gradient is the same product over dy with the weights
// transposed and turned (w'[c][k][r][s] = w[k][c][KH - 1 - r][KW - 1 - s]) and the padding
// KH - 1 - PH (KW - 1 - PW).

/// How conv_amx_forward reads its weights: w [K][C][KH][KW] as stored (bf16 bits or f32), used
/// as it is (the forward) or transposed and turned (the data gradient: the product's K is w's C).
struct AmxConvWeights {
  const void* data = nullptr;
  bool bf16 = false;
  bool transposed = false;
};

/// Floats of per-thread scratch conv_amx_forward needs: g is the product's geometry (its input
/// channels C, its padding), K its output channels.
std::int64_t conv_amx_forward_scratch_floats(const ConvGeom& g, std::int64_t K);

/// Halves of the packed weights (shared by the threads; packed by conv_amx_pack_weights).
std::int64_t conv_amx_weight_halves(const ConvGeom& g, std::int64_t K);
void conv_amx_pack_weights(const ConvGeom& g, std::int64_t K, AmxConvWeights w,
                           std::uint16_t* packed);

/// Samples [n0, n1) of y [N, K, OH, OW] = x * w (+ bias [K], then ReLU when `relu`) on the packed
/// weights; x and y as ActLayout says (y bf16 or f32). g.SH = g.SW = 1, K % 16 == 0,
/// amx_bf16_unavailable() empty. Each output sums its terms in an order fixed by the shapes.
void conv_amx_forward(const ConvGeom& g, std::int64_t K, const void* x, ActLayout x_layout,
                      const std::uint16_t* packed_w, const float* bias, bool relu, void* y,
                      ActLayout y_layout, std::int64_t n0, std::int64_t n1, float* scratch);

}  // namespace minidl::native
