// A bf16 matrix product on AMX tiles (amx_bf16.hpp) for matmul nodes marked bf16: y [M, N] =
// act(op(a) op(b) + bias), the factors bf16 (the upper halves of f32 values), the sums and y f32.
// One factor is read in place as the A tiles, so its rows must run along the sum (K): b when it is
// transposed (y^T = b op(a)^T: a linear layer's forward, b its [out, in] weight), or a when it is
// not. The other is packed per call into pairs along the sum, each 16 of its columns in one run
// of 1 KiB per 32 terms (a B tile). Where the factor read in place has at most 64 rows (a batch:
// a linear layer's data gradient dy w, which packs the weight), each strip of column tiles (at
// most 128 KiB) is packed right before the products that read it, in the thread's second-level
// cache; otherwise the factor read in place must be the larger, and all of the other is packed
// first (a linear layer's input, 256 KiB for the CIFAR CNN's fc1 forward) and shared by the
// threads.
//
// oneDNN 2.6's bf16 matmul ran the CIFAR CNN's fc1 forward and data gradient at 474-538 GFLOP/s
// (124 and 141 us per step, --profile) on an Intel Xeon with AMX, against 2.5 TFLOP/s for conv2's
// forward.
#pragma once

#include <cstdint>
#include <string>

namespace minidl::native {

/// The shape of one product: y [M, N], the sum over K; a [M, K] ([K, M] when ta), b [K, N] ([N, K]
/// when tb), rows of their own lengths; which factors are stored as bf16.
struct AmxGemmShape {
  bool ta = false, tb = false;
  std::int64_t M = 0, N = 0, K = 0;
  bool a_bf16 = false, b_bf16 = false;
};

/// Why the AMX product cannot take the shape, or "": the factor read in place (b when tb and N >=
/// M or N <= 64, else a when not ta and M >= N or M <= 64) must be bf16 with its rows (N, or M) a
/// multiple of 16, K a multiple of 32; amx_bf16_unavailable() empty.
std::string gemm_amx_refusal(const AmxGemmShape& s);

/// Floats of the pack gemm_amx needs (shared by the threads).
std::int64_t gemm_amx_pack_floats(const AmxGemmShape& s);

/// y [M, N] = op(a) op(b) (+ bias [N]; then ReLU when `relu`), f32, rows N apart. Each element
/// sums its terms in an order fixed by the shapes (runs of 32 in order, each in the tile's order).
void gemm_amx(const AmxGemmShape& s, const void* a, const void* b, const float* bias, bool relu,
              float* y, float* pack);

}  // namespace minidl::native
