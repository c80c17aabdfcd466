// The weight gradient of a stride-1 convolution on the CPU's AVX512-BF16 dot products
// (vdpbf16ps: 16 lanes, each adding the products of one pair of bf16 values to an f32 sum):
//   dw[k][c][r][s] = sum over n, oh, ow of dy[n][k][oh][ow] * x[n][c][oh - PH + r][ow - PW + s]
// The pairs run along ow. Each sample is first packed into pair-interleaved buffers:
//   dy -> [OH][OW/2][K] pairs (dy[k][oh][2j], dy[k][oh][2j + 1]): 16 filters' pairs per vector;
//   x  -> [OH + KH - 1][*][C] pairs, once starting at even padded columns, once at odd ones, so
//         that the pair a window column s sees at output pair j is one 32-bit word to broadcast.
// A register tile holds up to 4 vectors of 16 filters times up to 12 rows (c, r, s) of dw; every
// output pair loads the filters' dy vectors once and broadcasts one x word per row. From a
// channel-blocked layout (16 channels side by side: nChw16c, nhwc) packing is one permutation per
// 16 channels and two columns; from others it goes element by element.
//
// oneDNN 2.6's bf16 weight gradient for the CIFAR CNN's second layer (jit_avx512_core_bf16) ran at
// two thirds of its forward's rate on an AVX512-BF16 CPU, and its first layer's (3 input
// channels, taken as one mostly padded block of 16) at a third. On a CPU with AMX, the tile kernel
// (conv_amx.hpp) takes its place: there this one ran conv2's at 199 GFLOP/s against the tiles' 1155
// (--profile, Intel Xeon).
#pragma once

#include <cstdint>
#include <string>

#include "minidl/ops/native/dot_bf16.hpp"
#include "minidl/ops/native/im2col.hpp"

namespace minidl::native {

/// Where element (c, p) of one sample [C, P] of an activation lies, p = h * W + w: at
/// (c - c % block) * P + c % block + p * block elements from the sample's start. One number
/// describes the layouts minidl uses: plain (block 1), channel-blocked nChw16c / nChw8c (block 16
/// or 8; C a multiple of it), nhwc (block C). Samples lie C * P elements apart.
struct ActLayout {
  std::int64_t block = 1;
  bool bf16 = false;  // stored as bf16 (the upper half of an f32), else f32 (rounded when packed)
};

/// dy made by a max pooling's backward over the convolution's output (ops max_pool2d_bwd), its
/// windows disjoint and unpadded (stride >= window, pad 0): the pooling's output gradient dy
/// [N, K, POH, POW] and its argmax (i32, each window's chosen position in the plane, oh * OW +
/// ow, or -1 for none), both in `layout` (argmax's channels where dy's are; argmax's `bf16`
/// ignored). Position (oh, ow) takes its window's gradient where the window's argmax names it,
/// else 0. The backward writes 0 + the gradient, +0 for a -0; packed as -0 it changes no sum.
struct PooledGrad {
  const void* dy = nullptr;
  ActLayout layout;
  const std::int32_t* argmax = nullptr;
  std::int64_t POH = 0, POW = 0;  // the pooling's output plane
  std::int64_t KH = 0, KW = 0, SH = 0, SW = 0;
};

/// Where channel c of a sample starts (ActLayout): position p lies block * p further on.
inline std::int64_t channel_offset(std::int64_t c, std::int64_t block, std::int64_t plane) {
  return (c - c % block) * plane + c % block;
}

/// Words (pairs of bf16) of packing scratch one thread needs for geometry g with K filters.
std::int64_t conv_bf16_scratch_words(const ConvGeom& g, std::int64_t K);

/// The sum over samples [n0, n1) of dy [N, K, OH, OW] against x [N, C, H, W] into acc
/// [C*KH*KW][K] (f32, the kernel's own order: conv_bf16_unpack writes dw out; what acc held is
/// overwritten, n1 > n0) and, when bias_acc is not null, the sum of dy over positions added to
/// bias_acc [K]. g.SH = g.SW = 1 and K % 16 == 0; `scratch` holds
/// conv_bf16_scratch_words(g, K) words. Each element's terms are added in one order, fixed by the
/// shapes: samples, then output rows, then output pairs.
void conv_bf16_bwd_weights(const ConvGeom& g, std::int64_t K, const void* dy, ActLayout dy_layout,
                           const void* x, ActLayout x_layout, std::int64_t n0, std::int64_t n1,
                           float* acc, float* bias_acc, std::uint32_t* scratch);

/// Rows [i0, i1) of dw [K][C*KH*KW]: the sum of `parts` accumulators [C*KH*KW][K],
/// `part_stride` floats apart, in their order (left in the first accumulator's rows).
void conv_bf16_unpack(float* acc, std::int64_t parts, std::int64_t part_stride, std::int64_t rows,
                      std::int64_t K, float* dw, std::int64_t i0, std::int64_t i1);

}  // namespace minidl::native
