// im2col and col2im: the layout changes that turn a 2-D convolution into a GEMM.
//
// One sample's input [C,H,W] becomes a column matrix [C*KH*KW, OH*OW]: row (c, r, s) holds, for
// every output position (oh, ow), the input element that kernel tap (r, s) of channel c sees
// there, x[c][oh*sh - ph + r][ow*sw - pw + s], or 0 where that falls in the padding. Then
// y[K, OH*OW] = w[K, C*KH*KW] * col, and the backward passes are the transposed products.
// Both functions copy each channel's plane into a zero-bordered, L1-sized per-thread buffer
// first, so that their inner loops are plain (strided) row copies with no edge cases.
#pragma once

#include <cstddef>
#include <cstdint>

namespace minidl::native {

/// The geometry of one 2-D convolution or pooling window over a single sample.
struct ConvGeom {
  std::int64_t C = 0, H = 0, W = 0;  // input channels and size
  std::int64_t KH = 0, KW = 0;       // window size
  std::int64_t SH = 1, SW = 1;       // stride
  std::int64_t PH = 0, PW = 0;       // zero padding on each side
  std::int64_t OH = 0, OW = 0;       // output size

  std::int64_t rows() const { return C * KH * KW; }  // rows of the column matrix
  std::int64_t cols() const { return OH * OW; }      // columns of the column matrix
  /// Whether the column matrix is the input itself (1x1 window, stride 1, no padding).
  bool is_identity() const {
    return KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0;
  }
};

/// Output size of a window of size k, stride s and padding p over n elements (floor mode).
inline std::int64_t window_out_size(std::int64_t n, std::int64_t k, std::int64_t s,
                                    std::int64_t p) {
  return (n + 2 * p - k) / s + 1;
}

/// Rows of channels [c0, c1) of the column matrix; the caller may split channels over threads.
// src [C,H,W] -> dst [C*KH*KW, OH*OW]
void im2col(const ConvGeom& g, const float* src, float* dst, std::int64_t c0, std::int64_t c1);
inline void im2col(const ConvGeom& g, const float* src, float* dst) { im2col(g, src, dst, 0, g.C); }

/// The adjoint of im2col: every column entry is added to the input element it was read from.
/// Channels [c0, c1) of dst are overwritten (zeroed, then accumulated).
// src [C*KH*KW, OH*OW] -> dst [C,H,W]
void col2im(const ConvGeom& g, const float* src, float* dst, std::int64_t c0, std::int64_t c1);
inline void col2im(const ConvGeom& g, const float* src, float* dst) { col2im(g, src, dst, 0, g.C); }

/// Whether im2col and col2im may run their AVX-512 row loops (on a CPU with avx512f; they take
/// unit column stride, col2im only rows of whole vectors or shorter than one) or the portable
/// ones only. `portable` = true forces the portable loops, false restores the automatic choice:
/// for tests that cover both paths. The two give identical results.
bool im2col_uses_avx512();
void im2col_force_portable(bool portable);

/// A 64-byte aligned buffer of at least `floats` floats private to the calling thread, kept
/// between calls (it grows, never shrinks) so that steady-state kernels do not allocate: a
/// kernel's working buffer (a column matrix, a padded plane). Its contents are unspecified;
/// im2col and col2im do not use it.
float* thread_scratch(std::size_t floats);

}  // namespace minidl::native
