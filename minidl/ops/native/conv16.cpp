#include "minidl/ops/native/conv16.hpp"

#include <immintrin.h>

#include <array>
#include <utility>

#include "minidl/ops/native/direct_conv.hpp"

// Compiled for AVX-512 and chosen at run time (conv16_supports); the library is built for
// baseline x86-64.
#define MINIDL_TARGET_AVX512 __attribute__((target("avx512f")))

namespace minidl::native {
namespace {

using std::int64_t;

constexpr int kC = static_cast<int>(kConv16Channels);
constexpr int kCols = 16;  // output columns a row block holds in registers
constexpr int kGroup = 8;  // filters per weight-gradient pass

/// Output columns [w0, w0 + WB) of one output row: WB accumulators over the 16 filters. For each
/// window row and input channel the window's three weight vectors stay in registers while the
/// input row is swept: input column j adds to outputs j + 1, j and j - 1. Columns w0 - 1 and
/// w0 + WB (when inside the row) feed one output each. Each output sums its taps in the order
/// (window row, channel, window column) whatever the block.
template <int WB>
MINIDL_TARGET_AVX512 void row_block(const float* packed, const float* bias, bool relu,
                                    const float* x, float* y, int64_t H, int64_t W, int64_t h,
                                    int64_t w0) {
  __m512 acc[WB];
#pragma GCC unroll 16
  for (int i = 0; i < WB; ++i) acc[i] = _mm512_setzero_ps();
  const bool left = w0 > 0, right = w0 + WB < W;
  for (int64_t r = 0; r < 3; ++r) {
    const int64_t ih = h + r - 1;
    if (ih < 0 || ih >= H) continue;
    const float* xr = x + (ih * W + w0) * kC;  // input column w0 + j at xr + j * kC
    for (int c = 0; c < kC; ++c) {
      const float* wk = packed + (r * kC + c) * 3 * kC;
      const __m512 a0 = _mm512_loadu_ps(wk), a1 = _mm512_loadu_ps(wk + kC),
                   a2 = _mm512_loadu_ps(wk + 2 * kC);
      if (left) acc[0] = _mm512_fmadd_ps(_mm512_set1_ps(xr[c - kC]), a0, acc[0]);
#pragma GCC unroll 16
      for (int j = 0; j < WB; ++j) {
        const __m512 b = _mm512_set1_ps(xr[j * kC + c]);
        if (j + 1 < WB) acc[j + 1] = _mm512_fmadd_ps(b, a0, acc[j + 1]);
        acc[j] = _mm512_fmadd_ps(b, a1, acc[j]);
        if (j >= 1) acc[j - 1] = _mm512_fmadd_ps(b, a2, acc[j - 1]);
      }
      if (right) acc[WB - 1] = _mm512_fmadd_ps(_mm512_set1_ps(xr[WB * kC + c]), a2, acc[WB - 1]);
    }
  }
  const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  float* yr = y + (h * W + w0) * kC;
#pragma GCC unroll 16
  for (int i = 0; i < WB; ++i) {
    // The bias after the taps, as a bias_add after the convolution adds it; ReLU keeps lanes
    // where the sum > 0, so NaN becomes 0 as in the GEMM's epilogue.
    __m512 v = bias != nullptr ? _mm512_add_ps(acc[i], b) : acc[i];
    if (relu) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), v);
    _mm512_storeu_ps(yr + i * kC, v);
  }
}

using RowBlockFn = void (*)(const float*, const float*, bool, const float*, float*, int64_t,
                            int64_t, int64_t, int64_t);

/// row_block<1> .. row_block<16>, for a row's last, narrower block.
template <std::size_t... I>
constexpr std::array<RowBlockFn, sizeof...(I)> row_blocks(std::index_sequence<I...>) {
  return {&row_block<static_cast<int>(I) + 1>...};
}
constexpr auto kRowBlocks = row_blocks(std::make_index_sequence<kCols>());

/// One position's contribution to a weight-gradient pass: the input's three columns w - 1, w,
/// w + 1 of the pass's input row (those inside it: L, R) times 8 filters' dy, broadcast.
template <bool L, bool R>
MINIDL_TARGET_AVX512 inline void wgrad_position(__m512 (&acc)[3][kGroup], const float* xr,
                                                const float* dy, int64_t w) {
  const float* xw = xr + w * kC;
  const __m512 xm = L ? _mm512_loadu_ps(xw - kC) : _mm512_setzero_ps();
  const __m512 x0 = _mm512_loadu_ps(xw);
  const __m512 xp = R ? _mm512_loadu_ps(xw + kC) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int k = 0; k < kGroup; ++k) {
    const __m512 b = _mm512_set1_ps(dy[k]);
    if (L) acc[0][k] = _mm512_fmadd_ps(b, xm, acc[0][k]);
    acc[1][k] = _mm512_fmadd_ps(b, x0, acc[1][k]);
    if (R) acc[2][k] = _mm512_fmadd_ps(b, xp, acc[2][k]);
  }
}

}  // namespace

bool conv16_supports(const ConvGeom& g, int64_t K) {
  return K == kConv16Channels && g.C == kConv16Channels && g.KH == 3 && g.KW == 3 && g.SH == 1 &&
         g.SW == 1 && g.PH == 1 && g.PW == 1 && g.OH == g.H && g.OW == g.W && g.H > 0 && g.W > 0 &&
         direct_kernels_enabled();
}

void conv16_pack(const float* w, bool transposed, float* packed) {
  for (int o = 0; o < kC; ++o)
    for (int i = 0; i < kC; ++i)
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) {
          // Forward: output channel o = filter k, input channel i = c, w[k][c][r][s]. Data
          // gradient: output o = channel c of dx, input i = filter k of dy, the window turned.
          const float v = transposed ? w[((i * kC + o) * 3 + (2 - r)) * 3 + (2 - s)]
                                     : w[((o * kC + i) * 3 + r) * 3 + s];
          packed[((r * kC + i) * 3 + s) * kC + o] = v;
        }
}

void conv16_rows(const float* packed, const float* bias, bool relu, const float* x, float* y,
                 int64_t H, int64_t W, int64_t r0, int64_t r1) {
  const int64_t plane = H * W * kC;
  const int64_t full = W / kCols * kCols;
  const RowBlockFn tail = W > full ? kRowBlocks[W - full - 1] : nullptr;
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t n = row / H, h = row % H;
    const float* xn = x + n * plane;
    float* yn = y + n * plane;
    for (int64_t w0 = 0; w0 < full; w0 += kCols)
      row_block<kCols>(packed, bias, relu, xn, yn, H, W, h, w0);
    if (tail != nullptr) tail(packed, bias, relu, xn, yn, H, W, h, full);
  }
}

/// acc's order: [window row][filter group][window column][filter in group][channel].
MINIDL_TARGET_AVX512 void conv16_bwd_weights_sample(const float* dy, const float* x, int64_t H,
                                                    int64_t W, float* acc) {
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t grp = 0; grp < kC / kGroup; ++grp) {
      __m512 a[3][kGroup];
      for (auto& col : a)
        for (__m512& v : col) v = _mm512_setzero_ps();
      for (int64_t h = 0; h < H; ++h) {
        const int64_t ih = h + r - 1;
        if (ih < 0 || ih >= H) continue;
        const float* xr = x + ih * W * kC;
        const float* dyr = dy + h * W * kC + grp * kGroup;
        if (W == 1) {
          wgrad_position<false, false>(a, xr, dyr, 0);
          continue;
        }
        wgrad_position<false, true>(a, xr, dyr, 0);
        for (int64_t w = 1; w + 1 < W; ++w) wgrad_position<true, true>(a, xr, dyr + w * kC, w);
        wgrad_position<true, false>(a, xr, dyr + (W - 1) * kC, W - 1);
      }
      float* p = acc + (r * (kC / kGroup) + grp) * 3 * kGroup * kC;
      for (int s = 0; s < 3; ++s)
        for (int k = 0; k < kGroup; ++k) {
          float* q = p + (s * kGroup + k) * kC;
          _mm512_storeu_ps(q, _mm512_add_ps(_mm512_loadu_ps(q), a[s][k]));
        }
    }
  }
}

void conv16_unpack_weights(const float* acc, float* dw) {
  for (int r = 0; r < 3; ++r)
    for (int grp = 0; grp < kC / kGroup; ++grp)
      for (int s = 0; s < 3; ++s)
        for (int k = 0; k < kGroup; ++k)
          for (int c = 0; c < kC; ++c) {
            const int kk = grp * kGroup + k;
            dw[((kk * kC + c) * 3 + r) * 3 + s] =
                acc[(((r * (kC / kGroup) + grp) * 3 + s) * kGroup + k) * kC + c];
          }
}

}  // namespace minidl::native
