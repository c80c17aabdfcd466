// bf16_copy: y = x, a copy that bf16 products share. With --precision bf16 the mixed-precision
// pass (ops/precision.cpp) gives every value that two or more bf16 products read as a factor one
// such copy, stored as bf16 (ir::Value::stored), and points the products at it: the value is
// rounded to bf16 once per step (ties to even, as oneDNN's reorders round) instead of inside each
// product. The value stays f32 for the shape rules, so the copy is exact where y is stored as
// f32; the gradient passes through unchanged (dx = dy), as it does through a product's own
// rounding of its factors. A copy of a matrix may also be packed (ir::matrix_pack): the layout
// oneDNN's bf16 matmul reads its second factor in, which it otherwise packs on every call.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "minidl/core/threading.hpp"
#include "minidl/ir/graph.hpp"
#include "minidl/ops/bf16_round.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/ops/transpose16.hpp"

namespace minidl::ops {
namespace {

inline float from_bf16(std::uint16_t v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// n elements rounded to bf16; compiled for AVX2 too, picked at run time (the default build
// targets no vector extension beyond SSE2, where the narrowing stores stay scalar).
__attribute__((target_clones("avx2", "default"))) void round_to_bf16_any(const float* src,
                                                                         std::uint16_t* dst,
                                                                         std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_round(src[i]);
}

#if defined(__x86_64__)
// The same rounding 16 elements at a time in AVX-512 registers. GCC's clone of the loop above for
// AVX-512 ran in 256-bit vectors, 8 elements per dozen instructions, and took 72 us for the CIFAR
// CNN's fc1 weights (1M elements), as long as reading and writing them from memory.
[[gnu::target("avx512f")]] void round_to_bf16_avx512(const float* src, std::uint16_t* dst,
                                                     std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst + i),
        _mm512_maskz_cvtepi32_epi16(0xffff, bf16_round16(_mm512_loadu_ps(src + i))));
  }
  for (; i < n; ++i) dst[i] = bf16_round(src[i]);
}
#endif

void round_to_bf16(const float* src, std::uint16_t* dst, std::int64_t n) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return round_to_bf16_avx512(src, dst, n);
#endif
  round_to_bf16_any(src, dst, n);
}

#if defined(__x86_64__)
bool avx512bw() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return yes;
}

// Rows [r0, r1) (multiples of 16) of x [rows, cols] f32 into the packs "BA16a64b2a" ba and
// "AB16b64a2b" ab (either may be null), each element rounded once: 16 rows by 32 columns at a
// time, held as bf16 in 16 registers (a row's 32 in one), whose pairs of rows interleaved make
// lines of ba and whose transpose makes lines of ab. In ba, for each strip of 64 columns, blocks of
// 32 rows, each pair of rows interleaved (row 2p's element c, then row 2p + 1's); in ab, for each
// strip of 64 rows, blocks of 32 columns, each pair of columns (one 32-bit element of two bf16)
// for the strip's 64 rows. With `stream`, ba goes past the caches (non-temporal stores, where its
// lines are aligned): a weight's ba is read only in the backward (by the data gradient) and its
// ab right away (by the forward), and streaming ba made the copy of the CIFAR CNN's fc1 weight
// 60-70 us faster per step for 5-15 us more in the data gradient; an activation's ba alone (the
// weight gradient's factor, 256 KiB there) streamed cost that product 40-80 us.
[[gnu::target("avx512f,avx512bw")]] void pack_rows(const float* x, std::uint16_t* ba,
                                                   std::uint16_t* ab, std::int64_t rows,
                                                   std::int64_t cols, std::int64_t r0,
                                                   std::int64_t r1, bool stream) {
  stream = stream && reinterpret_cast<std::uintptr_t>(ba) % 64 == 0;
  // The high halves of two registers' 32-bit lanes, in order (a row's 32 rounded columns); the
  // 16-bit elements of two rows interleaved, columns 0-15 and 16-31.
  alignas(64) std::uint16_t high[32], first[32], second[32];
  for (int i = 0; i < 32; ++i) {
    high[i] = static_cast<std::uint16_t>(i < 16 ? 2 * i + 1 : 2 * (i - 16) + 1 + 32);
    first[i] = static_cast<std::uint16_t>(i % 2 == 0 ? i / 2 : 32 + i / 2);
    second[i] = static_cast<std::uint16_t>(first[i] + 16);
  }
  const __m512i take_high = _mm512_load_si512(high);
  const __m512i lo_pairs = _mm512_load_si512(first), hi_pairs = _mm512_load_si512(second);
  __m512 r[16];
  for (std::int64_t g0 = r0; g0 < r1; g0 += 16) {
    const float* src = x + g0 * cols;
    for (std::int64_t cb = 0; cb < cols / 32; ++cb, src += 32) {
      for (int i = 0; i < 16; ++i) {
        const float* row = src + i * cols;
        r[i] = _mm512_castsi512_ps(
            _mm512_permutex2var_epi16(bf16_round16_high(_mm512_loadu_ps(row)), take_high,
                                      bf16_round16_high(_mm512_loadu_ps(row + 16))));
      }
      if (ba != nullptr) {  // the 16 rows' pairs, columns 32 cb .. 32 cb + 31 of their strip
        const std::int64_t c = cb * 32;
        std::uint16_t* dst = ba + (c / 64 * (rows / 32) + g0 / 32) * 2048 + c % 64 * 2;
        for (int p = 0; p < 8; ++p) {
          std::uint16_t* line = dst + ((g0 % 32) / 2 + p) * 128;
          const __m512i a = _mm512_castps_si512(r[2 * p]), b = _mm512_castps_si512(r[2 * p + 1]);
          const __m512i lo = _mm512_permutex2var_epi16(a, lo_pairs, b);
          const __m512i hi = _mm512_permutex2var_epi16(a, hi_pairs, b);
          if (stream) {
            _mm512_stream_si512(reinterpret_cast<__m512i*>(line), lo);
            _mm512_stream_si512(reinterpret_cast<__m512i*>(line + 32), hi);
          } else {
            _mm512_storeu_si512(line, lo);
            _mm512_storeu_si512(line + 32, hi);
          }
        }
      }
      if (ab != nullptr) {
        std::uint16_t* dst = ab + (g0 / 64 * (cols / 32) + cb) * 2048 + g0 % 64 / 16 * 32;
        transpose16(r);
        for (int q = 0; q < 16; ++q) _mm512_storeu_ps(dst + q * 128, r[q]);
      }
    }
  }
  if (stream) _mm_sfence();
}
#endif

// The offset of (r, c) in a pack of a [rows, cols] matrix (ir::matrix_pack).
std::int64_t pack_offset(bool row_pairs, std::int64_t rows, std::int64_t cols, std::int64_t r,
                         std::int64_t c) {
  if (row_pairs)
    return (c / 64 * (rows / 32) + r / 32) * 2048 + r % 32 / 2 * 128 + c % 64 * 2 + r % 2;
  return (r / 64 * (cols / 32) + c / 32) * 2048 + c % 32 / 2 * 128 + r % 64 * 2 + c % 2;
}

// One output of a copy of a matrix: its buffer, stored type and layout (plain or a pack).
struct Target {
  void* data;
  DType stored;
  std::string layout;
};

// Rows [r0, r1) of x [rows, cols] (f32, plain) into t (in whole groups of 16 rows when t is a
// pack).
void copy_rows(const float* x, std::int64_t rows, std::int64_t cols, const Target& t,
               std::int64_t r0, std::int64_t r1) {
  if (!ir::matrix_pack(t.layout)) {
    if (t.stored == DType::BF16) {
      round_to_bf16(x + r0 * cols, static_cast<std::uint16_t*>(t.data) + r0 * cols,
                    (r1 - r0) * cols);
    } else {
      std::memcpy(static_cast<float*>(t.data) + r0 * cols, x + r0 * cols,
                  static_cast<std::size_t>((r1 - r0) * cols) * sizeof(float));
    }
    return;
  }
  auto* y = static_cast<std::uint16_t*>(t.data);
  const bool row_pairs = t.layout == "BA16a64b2a";
#if defined(__x86_64__)
  if (avx512bw())
    return pack_rows(x, row_pairs ? y : nullptr, row_pairs ? nullptr : y, rows, cols, r0, r1,
                     /*stream=*/false);
#endif
  // Element by element (CPUs without AVX-512 BW).
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      y[pack_offset(row_pairs, rows, cols, r, c)] = bf16_round(x[r * cols + c]);
}

// x [rows, cols] f32, plain, into every target, 16 rows at a time (a pack's rows fill whole
// blocks of 32 or 64: see ir::matrix_pack), every target from those rows before the next ones,
// so that all but the first read them from the cache. The threads split the rows, as elementwise
// kernels split the matrix (the optimizer's update among them), so that each reads the rows in
// its own caches: split by blocks of a pack instead, each thread read half of every row, and the
// update that follows took twice as long, its rows in the other core's cache.
void copy_matrix(const Tensor& x, const std::vector<Target>& targets) {
  const std::int64_t rows = x.shape()[0], cols = x.shape()[1];
  const std::int64_t group = rows % 16 == 0 ? 16 : 1;  // a plain copy of any rows takes 1
  const float* src = static_cast<const float*>(x.raw());
#if defined(__x86_64__)
  // Both packs: one pass (the linear layers' weights).
  if (avx512bw() && targets.size() == 2 && ir::matrix_pack(targets[0].layout) &&
      ir::matrix_pack(targets[1].layout) && targets[0].layout != targets[1].layout) {
    const bool ba_first = targets[0].layout == "BA16a64b2a";
    auto* ba = static_cast<std::uint16_t*>(targets[ba_first ? 0 : 1].data);
    auto* ab = static_cast<std::uint16_t*>(targets[ba_first ? 1 : 0].data);
    parallel_for(rows / 16, 32 * cols, [&](std::int64_t b, std::int64_t e) {
      pack_rows(src, ba, ab, rows, cols, b * 16, e * 16, /*stream=*/true);
    });
    return;
  }
#endif
  parallel_for(rows / group, group * cols * static_cast<std::int64_t>(targets.size()),
               [&](std::int64_t b, std::int64_t e) {
                 for (std::int64_t g = b; g < e; ++g)
                   for (const Target& t : targets)
                     copy_rows(src, rows, cols, t, g * group, (g + 1) * group);
               });
}

Target target(const Tensor& y, const ir::Value* v) { return {y.raw(), v->stored(), v->layout()}; }

// Why the native kernels do not copy x into y, or "": they copy within one layout (any: the
// conversion is elementwise), or a plain f32 matrix into a bf16 matrix pack.
std::string copy_declined(const ir::Value* x, const ir::Value* y) {
  if (ir::matrix_pack(y->layout())) {
    if (!x->layout().empty() || x->stored() != DType::F32)
      return fmt::format("{} is packed from {}, which is not a plain f32 matrix", y->ref(),
                         x->ref());
    return {};
  }
  if (x->layout() == y->layout()) return {};
  return fmt::format("{} is in layout {} but {} in {}; the copy keeps a layout", x->ref(),
                     x->layout().empty() ? "plain" : x->layout(), y->ref(),
                     y->layout().empty() ? "plain" : y->layout());
}

bool bf16_copy_supports(const ir::Node& n, std::string* why) {
  const std::string reason = copy_declined(n.input(0), n.output());
  if (!reason.empty() && why != nullptr) *why = reason;
  return reason.empty();
}

// Both copies from a plain f32 matrix, each plain or packed.
bool bf16_copies_supports(const ir::Node& n, std::string* why) {
  std::string reason;
  if (!n.input(0)->layout().empty() || n.input(0)->stored() != DType::F32)
    reason = fmt::format("{} is not a plain f32 matrix", n.input(0)->ref());
  for (int i = 0; i < 2 && reason.empty(); ++i) reason = copy_declined(n.input(0), n.output(i));
  if (!reason.empty() && why != nullptr) *why = reason;
  return reason.empty();
}

// x and y each stored as f32 or bf16, in one layout (whatever the layout pass left them as), or
// y a bf16 matrix pack of a plain x.
void bf16_copy_native(const ir::KernelArgs& k) {
  const Tensor& x = k.in[0];
  const Tensor& y = k.out[0];
  if (ir::matrix_pack(k.node->output()->layout()))
    return copy_matrix(x, {target(y, k.node->output())});
  const std::int64_t n = x.numel();
  const bool x16 = x.dtype() == DType::BF16, y16 = y.dtype() == DType::BF16;
  if (x16 == y16) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  if (y16) {
    const float* src = static_cast<const float*>(x.raw());
    auto* dst = static_cast<std::uint16_t*>(y.raw());
    elementwise(n, [&](std::int64_t b, std::int64_t e) { round_to_bf16(src + b, dst + b, e - b); });
    return;
  }
  const auto* src = static_cast<const std::uint16_t*>(x.raw());
  float* dst = static_cast<float*>(y.raw());
  elementwise(n, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) dst[i] = from_bf16(src[i]);
  });
}

void grad(ir::GradCtx& g) { g.set_input_grad(0, g.out_grad(0)); }

void bf16_copies_native(const ir::KernelArgs& k) {
  copy_matrix(k.in[0], {target(k.out[0], k.node->output(0)), target(k.out[1], k.node->output(1))});
}

void infer_copies(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  MINIDL_CHECK_NODE(c, c.input(0).rank() == 2, "expected a matrix, got ", c.input(0));
  c.set_output(0, c.input(0));
  c.set_output(1, c.input(0));
}

// Two copies: the gradient is the sum of theirs.
void copies_grad(ir::GradCtx& g) {
  ir::Value* dy = g.out_grad(0);
  ir::Value* dy2 = g.out_grad(1);
  if (dy == nullptr || dy2 == nullptr) return g.set_input_grad(0, dy != nullptr ? dy : dy2);
  g.set_input_grad(0, g.op(op_add, {dy, dy2}));
}

}  // namespace

MINIDL_OP(bf16_copy)
    .inputs({"x"})
    .infer(infer_unary_f32)
    .kernel(ir::Backend::Native, bf16_copy_native, bf16_copy_supports)
    .layout_aware()
    .bf16_values()
    .grad(grad);

// bf16_copies: y = y2 = x, two copies of a matrix made in one pass over it, each plain or in a
// matrix pack: what the mixed-precision pass gives a factor that products read in two layouts (a
// linear layer's weight: its forward reads it transposed, its data gradient as it is).
MINIDL_OP(bf16_copies)
    .inputs({"x"})
    .outputs({"y", "y2"})
    .infer(infer_copies)
    .kernel(ir::Backend::Native, bf16_copies_native, bf16_copies_supports)
    .layout_aware()
    .bf16_values()
    .grad(copies_grad);

}  // namespace minidl::ops
