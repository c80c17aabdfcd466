// matmul: y[M,N] = act(op(a) * op(b) + bias), op transposing when trans_a / trans_b, the bias
// [N] optional and the activation (attribute `activation`: none or relu) none by default. Linear
// layers store weights [out, in] as PyTorch does, so their forward is matmul(x, w, trans_b=true);
// the fusion pass folds a following bias_add and relu into the node (native: the GEMM's store
// epilogue; oneDNN: the primitive's bias and an eltwise post-op).
//
// matmul_accumulate: c = alpha * scale * op(a) * op(b) + beta * c, written in place into c (BLAS's
// gemm), scale being an optional scalar input read each step. The update fusion pass makes it
// from a weight gradient's matmul and its plain SGD update (alpha = -1, scale = the learning rate
// input, beta = 1), so the gradient is never stored and read back.
//
// matmul_sgd_momentum: the same fusion for an SGD update with momentum (and any weight decay or
// Nesterov): the GEMM's store applies the update to each tile of the product g = op(a) * op(b)
// while it is in registers (native::sgemm_momentum), or, where it cannot, g is computed a block
// at a time into a per-thread buffer that the update's own loop (ops/optim/sgd.hpp) reads while
// it is in cache. Either way the full gradient is never written.
#include <vector>

#include "minidl/ops/common.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/native/gemm.hpp"
#include "minidl/ops/native/gemm_amx.hpp"
#include "minidl/ops/native/gemm_bf16.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/optim/sgd.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

// The product's [M, N] for operands a and b under the trans_a / trans_b attributes.
Shape product_shape(ir::InferCtx& c) {
  const Shape& a = c.input(0);
  const Shape& b = c.input(1);
  MINIDL_CHECK_NODE(c, a.rank() == 2 && b.rank() == 2, "expected 2-D operands");
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32 && c.dtype(1) == DType::F32,
                    "expected f32 operands");
  const bool ta = c.attr<bool>("trans_a");
  const bool tb = c.attr<bool>("trans_b");
  const std::int64_t m = ta ? a[1] : a[0], ka = ta ? a[0] : a[1];
  const std::int64_t kb = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  MINIDL_CHECK_NODE(c, ka == kb, "inner dimensions differ: ", ka, " vs ", kb, " (trans_a=", ta,
                    ", trans_b=", tb, ")");
  return Shape{m, n};
}

void infer(ir::InferCtx& c) {
  const Shape mn = product_shape(c);
  const std::int64_t n = mn[1];
  if (c.num_inputs() > 2) {
    MINIDL_CHECK_NODE(c, c.dtype(2) == DType::F32, "expected an f32 bias");
    MINIDL_CHECK_NODE(c, c.input(2) == Shape{n}, "bias must be [", n, "] to match the output");
  }
  (void)activation_attr(c);
  c.set_output(0, mn);
}

void infer_accumulate(ir::InferCtx& c) {
  const Shape mn = product_shape(c);
  MINIDL_CHECK_NODE(c, c.dtype(2) == DType::F32, "expected an f32 accumulator");
  MINIDL_CHECK_NODE(c, c.input(2) == mn, "the accumulator is ", c.input(2), ", not the product's ",
                    mn);
  check_scalar_input(c, 3, DType::F32);
  c.set_output(0, mn);
}

// out[0] [M,N] = alpha * op(in[0]) * op(in[1]) + beta * out[0], through the native GEMM.
void native_product(const ir::KernelArgs& k, float alpha, float beta,
                    const native::GemmEpilogue& epilogue = {}) {
  const Shape& a = k.in[0].shape();
  const Shape& b = k.in[1].shape();
  const bool ta = k.attrs().get<bool>("trans_a");
  const bool tb = k.attrs().get<bool>("trans_b");
  const std::int64_t m = ta ? a[1] : a[0], kk = ta ? a[0] : a[1], n = tb ? b[0] : b[1];
  native::sgemm(ta, tb, m, n, kk, alpha, k.in[0].data<float>(), a[1], k.in[1].data<float>(), b[1],
                beta, k.out[0].data<float>(), n, epilogue);
}

// src a, weights b -> dst [M,N]
void matmul_native(const ir::KernelArgs& k) {
  native::GemmEpilogue epilogue;
  if (k.in.size() > 2) epilogue.bias = k.in[2].data<float>();
  epilogue.relu = activation_of(k.attrs()) == Activation::Relu;
  native_product(k, 1.0f, 0.0f, epilogue);
}

// The native f32 GEMM is tried before oneDNN's matmul (declared preferred) on the products where
// it was measured faster, in minidl_bench and in the CIFAR CNN's f32 step on an Intel Xeon with
// AVX-512 and AMX (2 threads; --profile, 10 000 samples, four alternating runs of each build):
// - narrow products, whose sum or output has at most 16 columns (a classifier of 10 classes, its
//   data gradient): oneDNN's call costs more than the product (fc2's forward 5.5-6.9 against
//   16-19 us per step, its data gradient 4.8-5.1 against 8.6-8.9; minidl_bench 1.1-1.95x);
// - a batch of at most 64 rows against a weight of 1 MiB or more, which comes from memory at
//   every step (fc1, 4 MiB: the data gradient 321-331 against 364-380 us, the forward 362-380
//   against 372-390). The MLP's smaller weights (0.8 MiB and less) stay with oneDNN, which was
//   1.04-1.07x faster on them in minidl_bench.
std::string native_f32_refusal(const ir::Node& n) {
  const Shape& a = n.input(0)->shape();
  const Shape& b = n.input(1)->shape();
  const bool ta = n.attrs().get<bool>("trans_a"), tb = n.attrs().get<bool>("trans_b");
  const std::int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1], cols = tb ? b[0] : b[1];
  constexpr std::int64_t kNarrow = 16, kBatch = 64, kLargeWeight = std::int64_t{1} << 20;
  if (std::min(k, cols) <= kNarrow) return "";
  if (m <= kBatch && k * cols * static_cast<std::int64_t>(sizeof(float)) >= kLargeWeight) return "";
  return fmt::format(
      "is preferred only for products with at most {} columns in the sum or the output, or of at "
      "most {} rows against a weight of 1 MiB or more (this one: [{}, {}] x [{}, {}])",
      kNarrow, kBatch, m, k, k, cols);
}

bool native_f32_supports(const ir::Node& n, std::string* why) {
  return decline(native_f32_refusal(n), why);
}

// In place: out[0] is in[2]'s buffer.
void matmul_accumulate_native(const ir::KernelArgs& k) {
  native_product(k, k.attrs().get<float>("alpha") * scalar_input(k, 3, 1.0f),
                 k.attrs().get<float>("beta"));
}

void infer_sgd_momentum(ir::InferCtx& c) {
  const Shape mn = product_shape(c);
  for (int i : {2, 3}) {
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32");
    MINIDL_CHECK_NODE(c, c.input(i) == mn, "input ", i, " is ", c.input(i), ", not the product's ",
                      mn);
  }
  check_scalar_input(c, 4, DType::F32);
  c.set_output(0, mn);
  c.set_output(1, mn);
}

// The GEMM's AVX-512 store applies the update tile by tile where it can (native::sgemm_momentum).
// Elsewhere the gradient is made block by block: columns [lo, lo + w) of every row when the
// product is wider than tall (op(a), the smaller operand, is then packed again for each block),
// else rows; a block's gradient (at most kBlockFloats, in the thread's buffer) updates the
// parameter and velocity elements at the same places before the next block is computed.
void matmul_sgd_momentum_native(const ir::KernelArgs& k) {
  const Shape& a = k.in[0].shape();
  const Shape& b = k.in[1].shape();
  const bool ta = k.attrs().get<bool>("trans_a");
  const bool tb = k.attrs().get<bool>("trans_b");
  const std::int64_t m = ta ? a[1] : a[0], kk = ta ? a[0] : a[1], n = tb ? b[0] : b[1];
  const float* pa = k.in[0].data<float>();
  const float* pb = k.in[1].data<float>();
  float* p = k.in[2].data<float>();
  float* v = k.in[3].data<float>();
  const MomentumRule rule{scalar_input(k, 4, 0.0f), 1.0f, k.attrs().get<float>("momentum"),
                          k.attrs().get<float>("weight_decay"), k.attrs().get<bool>("nesterov")};
  if (native::sgemm_momentum(ta, tb, m, n, kk, 1.0f, pa, a[1], pb, b[1], p, n,
                             {v, rule.lr, rule.momentum, rule.weight_decay, rule.nesterov}))
    return;
  // 256 Ki floats (1 MiB) per block stays in L2 (2 MiB per core on the Xeon measured) next to the
  // GEMM's packed panels, with rows long enough for the update to stream (blocks of 32 Ki
  // floats, rows of 96 columns on the CIFAR CNN's 256-row fc1: 607 against 545 us per step);
  // blocks are whole 48-column panels or 8-row slivers of the micro-kernel, at least 96 columns
  // or 16 rows.
  constexpr std::int64_t kBlockFloats = 256 * 1024;
  const bool by_cols = m <= n;
  const std::int64_t len = by_cols ? n : m, across = by_cols ? m : n, unit = by_cols ? 48 : 8;
  std::int64_t step = std::max(2 * unit, kBlockFloats / std::max<std::int64_t>(across, 1));
  step = std::min(len, step / unit * unit);
  const std::int64_t blocks = (len + step - 1) / step;
  parallel_for(blocks, step * across * kk, [&](std::int64_t b0, std::int64_t b1) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<std::size_t>(step * across));
    float* g = scratch.data();
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      const std::int64_t lo = blk * step, w = std::min(step, len - lo);
      if (by_cols) {
        // Columns [lo, lo + w) of op(b): b's columns, or its rows when transposed.
        native::sgemm(ta, tb, m, w, kk, 1.0f, pa, a[1], tb ? pb + lo * b[1] : pb + lo, b[1], 0.0f,
                      g, w);
        for (std::int64_t i = 0; i < m; ++i)
          sgd_momentum_range(p + i * n + lo, g + i * w, v + i * n + lo, w, rule);
      } else {
        native::sgemm(ta, tb, w, n, kk, 1.0f, ta ? pa + lo : pa + lo * a[1], a[1], pb, b[1], 0.0f,
                      g, n);
        sgd_momentum_range(p + lo * n, g, v + lo * n, w * n, rule);
      }
    }
  });
}

// Under --precision bf16 (the node marked bf16 by the fusion pass, which folds a bf16 weight
// gradient only where this kernel takes it: bf16_momentum_refusal): the gradient on AMX tiles or
// AVX512-BF16 dot products from the factors as they are stored (bf16 copies, or f32 rounded), a
// few rows at a time (native/gemm_bf16.hpp), each block updating its parameter and velocity rows
// with the update's own loop while it is in cache. The blocks of rows are split over the threads,
// each of which packs b into pairs of rows for itself first.
ir::Kernel make_sgd_momentum_bf16(const ir::Node& node) {
  const native::Bf16Factor fa{nullptr, node.input(0)->stored() == DType::BF16};
  const native::Bf16Factor fb{nullptr, node.input(1)->stored() == DType::BF16};
  return [fa, fb](const ir::KernelArgs& k) {
    const Shape& sa = k.in[0].shape();
    const std::int64_t batch = sa[0], m = sa[1], n = k.in[1].shape()[1];
    native::Bf16Factor a = fa, b = fb;
    a.data = k.in[0].raw();
    b.data = k.in[1].raw();
    const MomentumRule rule{scalar_input(k, 4, 0.0f), 1.0f, k.attrs().get<float>("momentum"),
                            k.attrs().get<float>("weight_decay"), k.attrs().get<bool>("nesterov")};
    float* p = k.in[2].data<float>();
    float* v = k.in[3].data<float>();
    const std::int64_t rows = native::tn_bf16_block_rows(n);
    // A block's rows in strips of 256 columns (16 KiB of gradient, in the first-level cache until
    // the update reads it), 16 floats more than a strip apart: whole rows of fc1's 4096 columns
    // (256 KiB, in the second level) took the tile stores as long as the update (perf), and rows
    // a multiple of 4 KiB apart fall into one set of the first-level cache.
    constexpr std::int64_t kStrip = 256;
    const std::int64_t ldg = std::min(n, kStrip) + 16;
    parallel_for((m + rows - 1) / rows, rows * n * batch, [&](std::int64_t b0, std::int64_t b1) {
      // Each thread packs all of b for itself: the pack is small next to the products, and a pack
      // shared between threads was read from the other core's cache at every step.
      thread_local std::vector<std::uint32_t> packed;
      thread_local std::vector<std::uint32_t> a_rows;
      thread_local std::vector<float> scratch;
      packed.resize(static_cast<std::size_t>(native::tn_bf16_pack_words(batch, n)));
      a_rows.resize(static_cast<std::size_t>(native::tn_bf16_rows_pack_words(batch)));
      scratch.resize(static_cast<std::size_t>(rows * ldg));
      native::tn_bf16_pack(batch, n, b, packed.data());
      for (std::int64_t blk = b0; blk < b1; ++blk) {
        const std::int64_t i0 = blk * rows, i1 = std::min(m, i0 + rows);
        native::tn_bf16_pack_rows(batch, m, a, i0, i1, a_rows.data());
        for (std::int64_t j0 = 0; j0 < n; j0 += kStrip) {
          const std::int64_t j1 = std::min(n, j0 + kStrip);
          native::tn_bf16_block(batch, i1 - i0, a_rows.data(), packed.data(), scratch.data(), ldg,
                                j0, j1);
          for (std::int64_t i = i0; i < i1; ++i)
            sgd_momentum_range(p + i * n + j0, scratch.data() + (i - i0) * ldg, v + i * n + j0,
                               j1 - j0, rule);
        }
      }
    });
  };
}

bool sgd_momentum_bf16_supports(const ir::Node& n, std::string* why) {
  return decline(bf16_momentum_refusal(n), why);
}

// Under --precision bf16 on AMX (native/gemm_amx.hpp): the factors as they are stored (the bf16
// copies mixed-precision gives a linear layer's weight, input and output gradient), one read in
// place as the A tiles; y f32. Tried before oneDNN's bf16 kernel where the CPU has AMX-BF16.
native::AmxGemmShape amx_shape(const ir::Node& n) {
  const Shape& a = n.input(0)->shape();
  const Shape& b = n.input(1)->shape();
  const bool ta = n.attrs().get<bool>("trans_a"), tb = n.attrs().get<bool>("trans_b");
  return {.ta = ta,
          .tb = tb,
          .M = ta ? a[1] : a[0],
          .N = tb ? b[0] : b[1],
          .K = ta ? a[0] : a[1],
          .a_bf16 = n.input(0)->stored() == DType::BF16,
          .b_bf16 = n.input(1)->stored() == DType::BF16};
}

std::string amx_matmul_refusal(const ir::Node& n) {
  if (ir::node_precision(n) != ir::Precision::BF16)
    return "computes in bf16 only (nodes marked precision=bf16)";
  for (const ir::Value* v : {n.input(0), n.input(1)})
    if (!v->layout().empty()) return fmt::format("takes {} plain only", v->ref());
  if (const ir::Value* y = n.output(0); y->stored() != DType::F32 || !y->layout().empty())
    return fmt::format("writes {} as plain f32 only", y->ref());
  return native::gemm_amx_refusal(amx_shape(n));
}

bool amx_matmul_supports(const ir::Node& n, std::string* why) {
  return decline(amx_matmul_refusal(n), why);
}

ir::Kernel make_amx_matmul(const ir::Node& node) {
  const native::AmxGemmShape s = amx_shape(node);
  const Tensor pack = Tensor::empty(Shape{native::gemm_amx_pack_floats(s)});
  const bool bias = node.inputs().size() > 2;
  const bool relu = activation_of(node.attrs()) == Activation::Relu;
  return [=](const ir::KernelArgs& k) {
    native::gemm_amx(s, k.in[0].raw(), k.in[1].raw(), bias ? k.in[2].data<float>() : nullptr, relu,
                     k.out[0].data<float>(), pack.data<float>());
  };
}

// Each case follows from dy = op(a) op(b); the transposes move to the operands so that no
// explicit transpose node is ever needed.
void grad(ir::GradCtx& g) {
  ir::Value* a = g.input(0);
  ir::Value* b = g.input(1);
  ir::Value* dy = fused_bias_activation_grad(g, 2);
  const bool ta = g.attrs().get<bool>("trans_a");
  const bool tb = g.attrs().get<bool>("trans_b");
  auto mm = [&](ir::Value* x, ir::Value* y, bool tx, bool ty) {
    return g.op(op_matmul, {x, y}, {{"trans_a", tx}, {"trans_b", ty}});
  };
  if (g.needs_input_grad(0)) {
    g.set_input_grad(0, !ta ? mm(dy, b, false, !tb) : mm(b, dy, tb, true));
  }
  if (g.needs_input_grad(1)) {
    g.set_input_grad(1, !tb ? mm(a, dy, !ta, false) : mm(dy, a, true, ta));
  }
}

std::int64_t flops(const ir::Node& n) {
  const Shape& a = n.input(0)->shape();
  const std::int64_t k = n.attrs().get<bool>("trans_a") ? a[0] : a[1];
  return 2 * n.output()->shape().numel() * k;
}

}  // namespace

MINIDL_OP(matmul)
    .inputs({"a", "b", "bias?"})
    .attr<bool>("trans_a", false)
    .attr<bool>("trans_b", false)
    .attr<std::string>("activation", "none")
    .infer(infer)
    .flops(flops)
    .kernel_factory(ir::Backend::Native, "native", make_amx_matmul, amx_matmul_supports)
    .mixed_precision()
    .bf16_values()
#if MINIDL_WITH_ONEDNN
    .kernel_factory(ir::Backend::OneDnn, "onednn", onednn::matmul_kernel, onednn::matmul_supports)
    .mixed_precision()
    .bf16_values()  // factors shared as bf16 (bf16_copy); the result stays f32
#endif
    .kernel(ir::Backend::Native, matmul_native, native_f32_supports)
    .preferred()
    .kernel(ir::Backend::Native, matmul_native)
    .grad(grad);

MINIDL_OP(matmul_accumulate)
    .inputs({"a", "b", "c", "scale?"})
    .outputs({"c_out"})
    .attr<bool>("trans_a", false)
    .attr<bool>("trans_b", false)
    .attr<float>("alpha", 1.0f)
    .attr<float>("beta", 1.0f)
    .infer(infer_accumulate)
    .flops(flops)
    .kernel(ir::Backend::Native, matmul_accumulate_native)
    .inplace(0, 2)
    .side_effect()
    .no_grad("an in-place accumulation (the fused form of a gradient product and its update)");

MINIDL_OP(matmul_sgd_momentum)
    .inputs({"a", "b", "param", "velocity", "lr"})
    .outputs({"param_out", "velocity_out"})
    .attr<bool>("trans_a", false)
    .attr<bool>("trans_b", false)
    .attr<float>("momentum")
    .attr<float>("weight_decay", 0.0f)
    .attr<bool>("nesterov", false)
    .infer(infer_sgd_momentum)
    .flops(flops)
    .kernel_factory(ir::Backend::Native, "native", make_sgd_momentum_bf16,
                    sgd_momentum_bf16_supports)
    .mixed_precision()
    .bf16_values()
    .kernel(ir::Backend::Native, matmul_sgd_momentum_native)
    .inplace(0, 2)
    .inplace(1, 3)
    .side_effect()
    .no_grad("an optimizer update (the fused form of a gradient product and its update)");

}  // namespace minidl::ops
