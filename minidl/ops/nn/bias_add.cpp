// bias_add: y = x + b broadcast along dimension 1 (features of [N,F], channels of [N,C,H,W]).
#include <cstdint>
#include <cstring>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  const Shape& x = c.input(0);
  const Shape& b = c.input(1);
  MINIDL_CHECK_NODE(c, x.rank() >= 2, "expected x of rank >= 2 [N,C,...]");
  MINIDL_CHECK_NODE(c, b.rank() == 1 && b[0] == x[1], "bias must be [", x[1], "] to match x");
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32, "expected f32");
  c.set_output(0, x);
}

// x [N,C,S] + bias [C] -> y, S the product of the trailing dimensions
void bias_add_native(const ir::KernelArgs& k) {
  const Shape& s = k.in[0].shape();
  const std::int64_t n = s[0], ch = s[1], sp = s.numel() / (n * ch);
  const float* x = k.in[0].data<float>();
  const float* b = k.in[1].data<float>();
  float* y = k.out[0].data<float>();
  if (sp == 1) {
    // [N,F]: whole rows, the bias vector alongside (per-channel runs would be one element long).
    parallel_for(n, ch, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * ch;
        float* yr = y + r * ch;
#pragma omp simd
        for (std::int64_t c = 0; c < ch; ++c) yr[c] = xr[c] + b[c];
      }
    });
    return;
  }
  parallel_for(n * ch, sp, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const float bv = b[r % ch];
      const float* xr = x + r * sp;
      float* yr = y + r * sp;
#pragma omp simd
      for (std::int64_t i = 0; i < sp; ++i) yr[i] = xr[i] + bv;
    }
  });
}

void grad(ir::GradCtx& g) {
  if (g.needs_input_grad(0)) g.set_input_grad(0, g.out_grad(0));
  if (g.needs_input_grad(1)) g.set_input_grad(1, g.op(op_bias_add_bwd, {g.out_grad(0)}));
}

void infer_bwd(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.input(0).rank() >= 2, "expected dy of rank >= 2 [N,C,...]");
  c.set_output(0, Shape{c.input(0)[1]});
}

// dy elements as f32: an f32 one, or a bf16 one (the upper half of an f32; ir::Value::stored).
inline float to_f32(float v) { return v; }
inline float to_f32(std::uint16_t v) {
  const std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// diff_dst [N,C,H,W] in a channel-blocked layout ([N, C/B, H*W, B], ir::Value::layout) ->
// diff_bias [C]: the B channels of a block are summed side by side, one block per thread.
template <typename T>
void bias_add_bwd_blocked(const ir::KernelArgs& k, std::int64_t block) {
  const Shape& s = k.in[0].shape();
  const std::int64_t n = s[0], ch = s[1], sp = s[2] * s[3], blocks = ch / block;
  MINIDL_ASSERT(block <= 16, "channel block ", block, " exceeds the kernel's 16 lanes");
  const T* dy = static_cast<const T*>(k.in[0].raw());
  float* db = k.out[0].data<float>();
  parallel_for(blocks, n * sp * block, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t cb = b0; cb < b1; ++cb) {
      float acc[16] = {};
      for (std::int64_t i = 0; i < n; ++i) {
        const T* p = dy + (i * blocks + cb) * sp * block;
        float part[16] = {};
        for (std::int64_t j = 0; j < sp; ++j) {
#pragma omp simd
          for (std::int64_t c = 0; c < block; ++c) part[c] += to_f32(p[j * block + c]);
        }
#pragma omp simd
        for (std::int64_t c = 0; c < block; ++c) acc[c] += part[c];
      }
      for (std::int64_t c = 0; c < block; ++c) db[cb * block + c] = acc[c];
    }
  });
}

// diff_dst as rows [R, C] (plain [N,F], or nhwc: R = N*H*W) -> diff_bias [C]: walk rows in order,
// adding contiguous rows; parallel over column blocks.
template <typename T>
void bias_add_bwd_rows(const ir::KernelArgs& k, std::int64_t rows, std::int64_t ch) {
  const T* dy = static_cast<const T*>(k.in[0].raw());
  float* db = k.out[0].data<float>();
  parallel_for(ch, rows, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) db[c] = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* row = dy + i * ch;
#pragma omp simd
      for (std::int64_t c = c0; c < c1; ++c) db[c] += to_f32(row[c]);
    }
  });
}

// diff_dst [N,C,S] -> diff_bias [C]. Each channel is summed by one thread in a fixed order, so
// the result does not depend on the thread count. dy may be stored as bf16 (between bf16
// convolutions), in the layouts they use (nhwc or channel-blocked).
template <typename T>
void bias_add_bwd_typed(const ir::KernelArgs& k) {
  const std::string& layout = k.node->input(0)->layout();
  const Shape& s = k.in[0].shape();
  const std::int64_t n = s[0], ch = s[1], sp = s.numel() / (n * ch);
  if (layout == "nhwc") return bias_add_bwd_rows<T>(k, n * sp, ch);
  if (const int block = ir::channel_block(layout); block > 1)
    return bias_add_bwd_blocked<T>(k, block);
  if (sp == 1) return bias_add_bwd_rows<T>(k, n, ch);
  const T* dy = static_cast<const T*>(k.in[0].raw());
  float* db = k.out[0].data<float>();
  parallel_for(ch, n * sp, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      float acc = 0.0f;
      for (std::int64_t i = 0; i < n; ++i) {
        const T* p = dy + (i * ch + c) * sp;
        float part = 0.0f;
#pragma omp simd reduction(+ : part)
        for (std::int64_t j = 0; j < sp; ++j) part += to_f32(p[j]);
        acc += part;
      }
      db[c] = acc;
    }
  });
}

void bias_add_bwd_native(const ir::KernelArgs& k) {
  if (k.in[0].dtype() == DType::BF16) return bias_add_bwd_typed<std::uint16_t>(k);
  MINIDL_CHECK(k.in[0].dtype() == DType::F32, k.node->describe(), ": dy is ", k.in[0].dtype());
  bias_add_bwd_typed<float>(k);
}

}  // namespace

MINIDL_OP(bias_add)
    .inputs({"x", "bias"})
    .infer(infer)
    .kernel(ir::Backend::Native, bias_add_native)
    .grad(grad);

MINIDL_OP(bias_add_bwd)
    .inputs({"dy"})
    .outputs({"dbias"})
    .infer(infer_bwd)
    .kernel(ir::Backend::Native, bias_add_bwd_native)
    .layout_aware()  // plain, or the blocked and nhwc layouts of oneDNN's convolutions
    .bf16_values()
    .no_grad("backward-only op; second derivatives are not supported");

}  // namespace minidl::ops
