// Direct 3x3 convolutions between 16 channels (stride 1, padding 1: a residual network's first
// stage), in the layout where a position's 16 channels lie side by side (nChw16c, which for 16
// channels is also nhwc). oneDNN 2.6's direct kernels run these at 0.7-0.85x the rate they reach
// from 32 channels on (one block of 16 filters gives each broadcast input one FMA), and its
// Winograd ones slower still. Here every input element broadcast from memory feeds three FMAs:
//   forward / data gradient: 16 output columns of one row in 16 registers, over the 16 filters;
//     the input element (row, column j, channel c) adds to outputs j+1, j, j-1 through the
//     window's three columns' weight vectors (the data gradient is the forward with the weights
//     transposed and flipped);
//   weight gradient: for one window row and 8 filters, 3 x 8 accumulators over the 16 channels;
//     each position loads three input vectors (the window's columns) and broadcasts 8 of dy.
// AVX-512 only, chosen at run time; elsewhere oneDNN or im2col and the GEMM run.
#pragma once

#include <cstdint>

#include "minidl/ops/native/im2col.hpp"

namespace minidl::native {

/// Channels the kernels take, in and out.
constexpr std::int64_t kConv16Channels = 16;
/// Floats of packed weights (conv16_pack).
constexpr std::int64_t kConv16PackedSize = kConv16Channels * kConv16Channels * 9;

/// Whether the kernels take a convolution of `g` with K filters: C = K = 16, a 3x3 window,
/// stride 1 and padding 1, where direct_kernels_enabled() (native/direct_conv.hpp). Values must
/// lie in the channels-innermost layout; the kernels' users check that.
bool conv16_supports(const ConvGeom& g, std::int64_t K);

/// Packs w [16,16,3,3] as the row kernel reads it, [3][16][3][16] (window row, input channel,
/// window column, output channel); for the data gradient (`transposed`) the filters and channels
/// swap and the window turns by 180 degrees, so conv16_rows computes dx from dy.
void conv16_pack(const float* w, bool transposed, float* packed);

/// Output rows [r0, r1) of n samples of [H][W][16] each (row r is sample r / H, row r % H):
/// y = x (*) packed, plus bias [16] when not nullptr (after the taps, as a bias_add would), then
/// ReLU if asked (NaN becomes 0). Each output element is summed in one order, fixed by the
/// shapes, whatever the rows, so splitting rows over threads keeps the bits.
void conv16_rows(const float* packed, const float* bias, bool relu, const float* x, float* y,
                 std::int64_t H, std::int64_t W, std::int64_t r0, std::int64_t r1);

/// Adds one sample's weight gradient, dy [H][W][16] against x [H][W][16], to acc (an
/// accumulator of kConv16PackedSize floats in the kernel's own order: conv16_unpack_weights
/// writes it out as [16,16,3,3]).
void conv16_bwd_weights_sample(const float* dy, const float* x, std::int64_t H, std::int64_t W,
                               float* acc);
void conv16_unpack_weights(const float* acc, float* dw);

}  // namespace minidl::native
