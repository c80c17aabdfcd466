// Direct convolution for layers with few input channels (a network's first layer: 1 channel for
// MNIST, 3 for CIFAR-10). There the column matrix of im2col has only C*KH*KW rows (9 or 27), so
// the GEMM behind it has a tiny inner dimension and im2col's copy costs as much as the product.
// These kernels read the input where it lies instead: each vector of 16 output columns of one
// output row is accumulated tap by tap (c, r, s) from 16 contiguous input elements, for 8 filters
// at once, with the padding and the row ends handled by load masks (no padded copy, no column
// matrix). AVX-512 only; elsewhere the im2col path runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "minidl/ops/native/conv_bf16.hpp"
#include "minidl/ops/native/im2col.hpp"

namespace minidl::native {

/// Whether the direct kernels take a convolution of `g` with K filters: at most
/// kDirectConvMaxChannels input channels, unit column stride, a window at most
/// kDirectConvMaxWindow wide, on a CPU with AVX-512, unless the environment variable
/// MINIDL_DIRECT_CONV=off (read once; on or off, else an error) or direct_conv_force_off
/// switches them off. The choice depends on the shapes, the CPU and that setting only.
bool direct_conv_supports(const ConvGeom& g, std::int64_t K);

/// Whether the CPU runs minidl's own AVX-512 convolution kernels (these, and the 16-channel ones
/// of native/conv16.hpp) and MINIDL_DIRECT_CONV (read once) does not switch them off: "off" (or
/// "0") leaves every convolution to the other kernels, "on" (or "1", or unset) lets the shapes
/// decide. For comparing the paths on whole models.
bool direct_kernels_enabled();

constexpr std::int64_t kDirectConvMaxChannels = 4;
constexpr std::int64_t kDirectConvMaxWindow = 16;

/// Switches the direct kernels off (true) or back on (false), so that tests can compare them
/// with the im2col path on the same shapes.
void direct_conv_force_off(bool off);

/// The geometry of one direct convolution and its load masks, made once per node.
struct DirectConv {
  ConvGeom g;
  std::int64_t K = 0;       // filters
  std::int64_t blocks = 0;  // ceil(K / 8): filters are handled 8 at a time
  std::int64_t chunks = 0;  // ceil(OW / 16): vectors per output row
  /// out_masks[chunk]: the lanes of output vector `chunk` inside the output row.
  std::vector<std::uint16_t> out_masks;
  /// masks[chunk * KW + s]: the lanes of output vector `chunk` whose tap s reads an input column
  /// inside the row (the others are padding, or past the output row's end).
  std::vector<std::uint16_t> masks;
  /// The weights [K, C*KH*KW] (and bias [K], or zeros) rearranged as the forward reads them:
  /// [blocks][C*KH*KW][8] and [blocks][8], zeros for the filters past K.
  std::int64_t packed_size() const { return blocks * 8 * (g.rows() + 1); }

  DirectConv(const ConvGeom& geom, std::int64_t filters);
};

/// Writes the forward's packed weights and bias (bias may be nullptr: zeros) into `packed`
/// (packed_size() floats).
void direct_conv_pack(const DirectConv& d, const float* weights, const float* bias, float* packed);

/// Output rows [oh0, oh1) of one sample: y[K, OH, OW] = x[C, H, W] (*) w, plus the bias when
/// `bias` (added after the taps, as a separate bias_add would), then ReLU if asked (NaN becomes
/// 0). Every output element is computed the same way whatever the row range, so splitting rows
/// over threads does not change the bits.
void direct_conv_fwd(const DirectConv& d, const float* packed, const float* x, float* y, bool bias,
                     bool relu, std::int64_t oh0, std::int64_t oh1);

/// The weight gradient of n samples, dw[K, C*KH*KW] = sum_i dy[i] (*) x[i], written (not added),
/// and, when db is not nullptr, the bias gradient db[K] = the sum of dy[i] over samples and
/// positions. Each output is summed in an order fixed by the shapes; with `parallel` the work
/// items (filter blocks by tap rows) are spread over the OpenMP threads, with the same bits.
void direct_conv_bwd_weights(const DirectConv& d, const float* dy, const float* x, std::int64_t n,
                             float* dw, float* db, bool parallel);

// ---- the weight gradient through a max pooling, in f32 --------------------------------------
// dw[k][c][r][s] = sum over samples and windows of dy[k][window] * x[c][oh - PH + r][ow - PW + s]
// at the position (oh, ow) the window's argmax names (PooledGrad): the pooling's windows being
// disjoint, every other position's gradient is 0, so only one position in a window's
// KH x KW (a quarter for 2x2 windows) is multiplied, where a dense weight gradient over the
// pooling's backward multiplies them all. Each sample's input is copied zero-padded, channels
// innermost, so that a window row (s, c) is KW * C contiguous values: one vector of 16 lanes
// when KW * C <= 16, added times the window's gradient into the filter's accumulator for that row.

/// At most this many window rows (KH): the accumulators of four filters stay in registers.
constexpr std::int64_t kPooledMaxRows = 5;

/// Why direct_conv_bwd_weights_pooled cannot take geometry g (stride 1, KW * C <= 16, KH <=
/// kPooledMaxRows, AVX-512 and the direct kernels enabled), or "" when it can.
std::string direct_conv_pooled_refusal(const ConvGeom& g);

/// Floats of per-thread scratch direct_conv_bwd_weights_pooled needs for g, K filters and
/// `windows` pooling windows per filter (POH * POW).
std::int64_t direct_conv_pooled_scratch_floats(const ConvGeom& g, std::int64_t K,
                                               std::int64_t windows);

/// conv_amx_bwd_weights_pooled's contract in f32: the sum over samples [n0, n1) of the weight
/// gradient through the pooling (PooledGrad, dy f32 or bf16) against x (ActLayout, f32 or bf16)
/// into acc [C*KH*KW][K] (overwritten; rows in (c, r, s) order, n1 > n0), and the sum of dy over
/// the windows added to bias_acc [K] when it is not null. `scratch` holds
/// direct_conv_pooled_scratch_floats(g, K, dy.POH * dy.POW) floats. Each element's terms are
/// added in an order fixed by the shapes: samples, then windows in order.
void direct_conv_bwd_weights_pooled(const ConvGeom& g, std::int64_t K, const PooledGrad& dy,
                                    const void* x, ActLayout x_layout, std::int64_t n0,
                                    std::int64_t n1, float* acc, float* bias_acc, float* scratch);

}  // namespace minidl::native
