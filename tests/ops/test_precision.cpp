// Mixed precision (--precision bf16): which nodes ops::MixedPrecision marks; that a marked
// oneDNN kernel computes on bf16-rounded factors (its result matches f32 arithmetic on the
// rounded inputs, and differs from it on the unrounded ones by bf16's rounding); what dispatch
// reports; and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "minidl/core/rng.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/native/amx_bf16.hpp"
#include "minidl/ops/native/gemm_amx.hpp"
#include "minidl/ops/native/gemm_bf16.hpp"
#include "minidl/ops/native/peak.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"
#include "support/error_of.hpp"

using namespace minidl;
using minidl::testing::error_of;

namespace {

/// Rounds every element of t to the nearest bf16 (ties to even), as oneDNN's f32 -> bf16
/// reorder does.
Tensor rounded_to_bf16(const Tensor& t) {
  Tensor r = t.clone();
  float* p = r.data<float>();
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    std::uint32_t u = 0;
    std::memcpy(&u, &p[i], sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&p[i], &u, sizeof u);
  }
  return r;
}

/// Writes t into `in`, an input stored as bf16 (bf16_round's bits) or f32 (as it is).
void store_input(const Tensor& t, const Tensor& in, bool bf16) {
  if (!bf16) {
    Tensor(in).copy_from(t);
    return;
  }
  const Tensor r = rounded_to_bf16(t);
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    std::uint32_t u = 0;
    std::memcpy(&u, r.data<float>() + i, sizeof u);
    static_cast<std::uint16_t*>(in.raw())[i] = static_cast<std::uint16_t>(u >> 16);
  }
}

/// max |a - b| / max |b|.
double relative_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double diff = 0.0, scale = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(double(a.data<float>()[i]) - b.data<float>()[i]));
    scale = std::max(scale, std::abs(double(b.data<float>()[i])));
  }
  return diff / scale;
}

/// One node of `op` on inputs `ins`, compiled for `backend` after MixedPrecision(precision);
/// returns its output, and in `kernels` the executable's kernel table. `pinned`: the node names
/// the backend (a native bf16 kernel, tried first otherwise, then does not take it).
Tensor run_node(std::string_view op, const std::vector<Tensor>& ins, ir::Attrs attrs,
                ir::Backend backend, ir::Precision precision, std::string* kernels = nullptr,
                bool pinned = false) {
  ir::Graph g;
  std::vector<ir::Value*> vs;
  for (std::size_t i = 0; i < ins.size(); ++i)
    vs.push_back(ops::input(g, "x" + std::to_string(i), ins[i].shape()));
  ir::Node* n = ops::apply_node(op, vs, std::move(attrs));
  if (pinned) n->annotations().set("backend", std::string(ir::backend_name(backend)));
  g.add_output(n->output(0));
  ops::MixedPrecision(precision).run(g);
  runtime::Executable exe(g, {.backend = backend});
  for (std::size_t i = 0; i < ins.size(); ++i) {
    Tensor in = exe.input("x" + std::to_string(i));  // a handle on the executable's buffer
    in.copy_from(ins[i]);
  }
  exe.run();
  if (kernels != nullptr) *kernels = exe.kernel_table();
  return exe.value(g.outputs()[0]).clone();
}

struct Bf16Case {
  std::string name;
  std::string op;
  std::vector<Shape> shapes;
  ir::Attrs attrs;
  std::vector<int> factors;  // the inputs the kernel rounds to bf16 (a bias is not)
};

std::vector<Bf16Case> cases() {
  return {
      {"matmul", "matmul", {{32, 64}, {64, 48}}, {}, {0, 1}},
      {"matmul trans_a", "matmul", {{64, 32}, {64, 48}}, {{"trans_a", true}}, {0, 1}},
      {"matmul trans_b bias relu",
       "matmul",
       {{32, 64}, {48, 64}, {48}},
       {{"trans_b", true}, {"activation", std::string("relu")}},
       {0, 1}},
      {"conv2d bias relu",
       "conv2d",
       {{4, 16, 10, 10}, {32, 16, 3, 3}, {32}},
       {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"activation", std::string("relu")}},
       {0, 1}},
      {"conv2d first layer, stride 2",
       "conv2d",
       {{4, 3, 12, 12}, {16, 3, 3, 3}},
       {{"stride", ir::Ints{2, 2}}, {"pad", ir::Ints{1, 1}}},
       {0, 1}},
      {"conv2d_bwd_data",
       "conv2d_bwd_data",
       {{4, 32, 10, 10}, {32, 16, 3, 3}},
       {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"in_shape", ir::Ints{4, 16, 10, 10}}},
       {0, 1}},
      {"conv2d_bwd_weights",
       "conv2d_bwd_weights",
       {{4, 32, 10, 10}, {4, 16, 10, 10}},
       {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"kernel", ir::Ints{3, 3}}},
       {0, 1}},
      {"conv2d_bwd_weights_bias (its dw)",
       "conv2d_bwd_weights_bias",
       {{4, 32, 10, 10}, {4, 16, 10, 10}},
       {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"kernel", ir::Ints{3, 3}}},
       {0, 1}},
  };
}

}  // namespace

TEST(Precision, MixedPrecisionMarksTheOpsWithABf16Kernel) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 16, 8, 8});
  ir::Value* w = ops::input(g, "w", {4, 16, 3, 3});
  ir::Value* h = ops::relu(
      ops::apply("conv2d", {x, w}, {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}}));
  ir::Value* y = ops::matmul(ops::reshape(h, {2, 4 * 8 * 8}), ops::input(g, "v", {256, 10}));
  g.add_output(y);
  EXPECT_FALSE(ops::MixedPrecision(ir::Precision::F32).run(g));
  for (const ir::Node* n : g.nodes()) EXPECT_EQ(ir::node_precision(*n), ir::Precision::F32);
  EXPECT_TRUE(ops::MixedPrecision(ir::Precision::BF16).run(g));
  for (const ir::Node* n : g.nodes()) {
    const bool marked = n->op() == "conv2d" || n->op() == "matmul";
    EXPECT_EQ(ir::node_precision(*n), marked ? ir::Precision::BF16 : ir::Precision::F32)
        << n->describe();
    EXPECT_EQ(ir::has_bf16_kernel(n->def()), MINIDL_WITH_ONEDNN && marked) << n->describe();
  }
  // A node marked f32 by hand keeps its mark.
  ir::Graph g2;
  ir::Value* m = ops::matmul(ops::input(g2, "a", {2, 3}), ops::input(g2, "b", {3, 4}));
  m->producer()->annotations().set("precision", std::string("f32"));
  g2.add_output(m);
  EXPECT_FALSE(ops::MixedPrecision(ir::Precision::BF16).run(g2));
  EXPECT_EQ(ir::node_precision(*m->producer()), ir::Precision::F32);
  // An unknown mark is an error naming the node.
  m->producer()->annotations().set("precision", std::string("fp16"));
  EXPECT_NE(
      error_of([&] { (void)ir::node_precision(*m->producer()); }).find("unknown precision 'fp16'"),
      std::string::npos);
}

TEST(Precision, ConvolutionsThatFillNoChannelBlockStayF32) {
  // Input and output channels: only where both are under the bf16 layout's channel block (16 in
  // nChw16c, AVX512-BF16 without AMX; AMX's nhwc has none) do all three passes stay f32; a first
  // layer with 16 or more filters (3 -> 16) and a layer into few filters from 16 channels
  // (16 -> 4) are marked bf16 everywhere.
  const int block = ir::channel_block(ops::bf16_layout());
  for (const auto& [c, k, fills] : {std::tuple{1, 8, false}, std::tuple{15, 15, false},
                                    std::tuple{3, 16, true}, std::tuple{16, 4, true}}) {
    const bool bf16 = fills || block == 1;
    SCOPED_TRACE(std::to_string(c) + " -> " + std::to_string(k));
    ir::Graph g;
    ir::Value* x = ops::input(g, "x", {2, c, 8, 8});
    ir::Value* w = ops::input(g, "w", {k, c, 3, 3});
    ir::Value* dy = ops::input(g, "dy", {2, k, 8, 8});
    const ir::Ints s{1, 1}, p{1, 1};
    g.add_output(ops::apply("conv2d", {x, w}, {{"stride", s}, {"pad", p}}));
    g.add_output(ops::apply("conv2d_bwd_data", {dy, w},
                            {{"stride", s}, {"pad", p}, {"in_shape", ir::Ints{2, c, 8, 8}}}));
    g.add_output(ops::apply("conv2d_bwd_weights", {dy, x},
                            {{"stride", s}, {"pad", p}, {"kernel", ir::Ints{3, 3}}}));
    ops::MixedPrecision(ir::Precision::BF16, /*share_factors=*/false).run(g);
    for (const ir::Value* y : g.outputs()) {
      const ir::Node& n = *y->producer();
      EXPECT_EQ(ir::node_precision(n),
                bf16 && MINIDL_WITH_ONEDNN ? ir::Precision::BF16 : ir::Precision::F32)
          << n.describe();
    }
  }
}

TEST(Precision, Bf16KernelsMultiplyRoundedFactorsAndAccumulateInF32) {
  if (std::string why = ops::bf16_unavailable(); !why.empty()) GTEST_SKIP() << "bf16 " << why;
  for (const Bf16Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> ins, rounded;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
      Tensor t = Tensor::empty(c.shapes[i]);
      CounterRng(11 + i).fill_normal(t, 0, 0.0f, 1.0f);
      ins.push_back(t);
      const bool factor = std::find(c.factors.begin(), c.factors.end(), int(i)) != c.factors.end();
      rounded.push_back(factor ? rounded_to_bf16(t) : t);
    }
    std::string kernels;
    const Tensor bf16 =
        run_node(c.op, ins, c.attrs, ir::Backend::OneDnn, ir::Precision::BF16, &kernels, true);
    EXPECT_NE(kernels.find("-> onednn bf16"), std::string::npos) << kernels;
    // The native f32 kernel on the rounded factors: exact products (8-bit significands), f32
    // sums; only the order of the sums differs.
    const Tensor reference =
        run_node(c.op, rounded, c.attrs, ir::Backend::Native, ir::Precision::F32);
    EXPECT_LT(relative_difference(bf16, reference), 1e-5);
    // On the unrounded factors the f32 result differs by bf16's rounding (2^-9 relative per
    // factor), not more.
    const Tensor f32 = run_node(c.op, ins, c.attrs, ir::Backend::OneDnn, ir::Precision::F32);
    const double rounding = relative_difference(bf16, f32);
    EXPECT_GT(rounding, 1e-4);
    EXPECT_LT(rounding, 2e-2);
  }
}

TEST(Precision, MarkedNodesPreferBf16KernelsUnlessTheyNameABackend) {
  Tensor a = Tensor::empty({8, 16}), b = Tensor::empty({16, 4});
  CounterRng(3).fill_normal(a, 0, 0.0f, 1.0f);
  CounterRng(4).fill_normal(b, 0, 0.0f, 1.0f);
  ir::Graph g;
  ir::Value* y = ops::matmul(ops::input(g, "a", {8, 16}), ops::input(g, "b", {16, 4}));
  ir::Node* n = y->producer();
  g.add_output(y);
  ops::MixedPrecision(ir::Precision::BF16).run(g);
  // With native kernels preferred, the marked product still takes oneDNN's bf16 one.
  const std::vector<const ir::KernelDef*> order = ir::kernel_order(*n, ir::Backend::Native);
  ASSERT_FALSE(order.empty());
  EXPECT_EQ(order.front()->bf16, bool(MINIDL_WITH_ONEDNN));
  // A backend annotation wins: the node then runs natively, in f32.
  n->annotations().set("backend", std::string("native"));
  EXPECT_EQ(ir::kernel_order(*n, ir::Backend::OneDnn).front()->backend, ir::Backend::Native);
  runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
  EXPECT_NE(exe.kernel_table().find("-> native\n"), std::string::npos) << exe.kernel_table();
  Tensor in_a = exe.input("a"), in_b = exe.input("b");
  in_a.copy_from(a);
  in_b.copy_from(b);
  exe.run();
  const Tensor f32 = run_node("matmul", {a, b}, {}, ir::Backend::Native, ir::Precision::F32);
  EXPECT_EQ(relative_difference(exe.value(g.outputs()[0]), f32), 0.0);
}

TEST(Precision, Refusals) {
  EXPECT_NO_THROW(ops::check_precision(ir::Precision::F32));
  if (const std::string why = ops::bf16_unavailable(); why.empty()) {
    EXPECT_NO_THROW(ops::check_precision(ir::Precision::BF16));
  } else {
    // Without bf16 units (or oneDNN) the error names what is missing.
    const std::string error = error_of([] { ops::check_precision(ir::Precision::BF16); });
    EXPECT_NE(error.find(why), std::string::npos) << error;
    EXPECT_NE(why.find(MINIDL_WITH_ONEDNN ? "AVX512-BF16" : "oneDNN"), std::string::npos) << why;
  }
  EXPECT_EQ(ops::parse_precision("bf16"), ir::Precision::BF16);
  EXPECT_NE(error_of([] { (void)ops::parse_precision("fp16"); }).find("expected f32 or bf16"),
            std::string::npos);
}

TEST(Precision, WarnsWhereBf16DotProductsAreSlowerThanF32Fmas) {
  // No warning with AMX (its tiles are the bf16 products), nor where the dot products keep up.
  EXPECT_EQ(ops::bf16_slower_than_f32(true, 80, 170), "");
  EXPECT_EQ(ops::bf16_slower_than_f32(false, 340, 170), "");
  EXPECT_EQ(ops::bf16_slower_than_f32(false, 170, 170), "");
  const std::string why = ops::bf16_slower_than_f32(false, 82.4, 170.2);
  EXPECT_NE(why.find("no AMX-BF16"), std::string::npos) << why;
  EXPECT_NE(why.find("82 GFLOP/s"), std::string::npos) << why;
  EXPECT_NE(why.find("against 170"), std::string::npos) << why;
  EXPECT_NE(why.find("0.48x"), std::string::npos) << why;
}

TEST(Precision, PeakLoopsRunTheirMultiplyAdds) {
  // Every lane of accumulator a ends at a + 2 * iterations: the sum tells that each iteration ran.
  for (const native::PeakLoop loop : {native::PeakLoop::F32Fma, native::PeakLoop::Bf16Dot}) {
    if (const std::string why = native::peak_loop_unavailable(loop); !why.empty()) {
      EXPECT_EQ(native::measure_peak(loop), 0.0);
      EXPECT_NE(error_of([loop] { (void)native::run_peak_loop(loop, 1); }).find(why),
                std::string::npos);
      continue;
    }
    const std::string isa = native::peak_loop_isa(loop);
    const double lanes = isa == "avx2" ? 8 : 16;
    EXPECT_EQ(native::peak_loop_flops(loop),
              12 * lanes * (loop == native::PeakLoop::Bf16Dot ? 4 : 2));
    for (const std::int64_t iterations : {0, 1, 1000}) {
      EXPECT_EQ(native::run_peak_loop(loop, iterations), lanes * (66 + 24.0 * iterations))
          << isa << ", " << iterations << " iterations";
    }
    const double gflops = native::measure_peak(loop);
    EXPECT_TRUE(std::isfinite(gflops) && gflops > 0) << isa << ": " << gflops;
  }
  EXPECT_NE(error_of([] {
              (void)native::run_peak_loop(native::PeakLoop::F32Fma, -1);
            }).find("iterations must be >= 0"),
            std::string::npos);
}

TEST(Precision, Bf16WeightGradientsStayApartFromAPlainSgdUpdate) {
  // A linear layer's three products and a plain update of its weight: in f32 the weight gradient
  // folds into matmul_accumulate, reading x and dy. Under bf16 x, w and dy each get a bf16 copy
  // (two products read each) and the weight gradient stays a bf16 product beside its update
  // (matmul_accumulate computes in f32 only); without oneDNN nothing is marked bf16 and it folds
  // as in f32.
  for (const ir::Precision p : {ir::Precision::F32, ir::Precision::BF16}) {
    SCOPED_TRACE(std::string(ir::precision_name(p)));
    ir::Graph g;
    ir::Value* x = ops::input(g, "x", {8, 16});
    ir::Value* dy = ops::input(g, "dy", {8, 4});
    ir::Value* w = ops::parameter(g, "w", Tensor::zeros({4, 16}));
    g.add_output(ops::matmul(x, w, false, true));
    g.add_output(ops::matmul(dy, w));
    ir::Value* grad = ops::matmul(dy, x, true, false);
    ir::Value* lr = ops::input(g, "lr", {});
    g.add_output(ops::apply("sgd", {w, grad, lr}));
    ops::MixedPrecision(p).run(g);
    const bool copies = p == ir::Precision::BF16 && MINIDL_WITH_ONEDNN;
    EXPECT_EQ(ops::FuseUpdateIntoProduct().run(g), !copies) << ir::to_text(g);
    const ir::Node* fused = nullptr;
    const ir::Node* update = nullptr;
    for (const ir::Node* n : g.nodes()) {
      if (n->op() == "matmul_accumulate") fused = n;
      if (n->op() == "sgd") update = n;
    }
    if (copies) {
      ASSERT_EQ(fused, nullptr) << ir::to_text(g);
      ASSERT_NE(update, nullptr) << ir::to_text(g);
      const ir::Node* product = update->input(1)->producer();
      EXPECT_EQ(product->op(), "matmul");
      EXPECT_EQ(ir::node_precision(*product), ir::Precision::BF16);
      EXPECT_EQ(product->input(0)->producer()->op(), "bf16_copy");
      EXPECT_EQ(product->input(1)->producer()->op(), "bf16_copy");
    } else {
      ASSERT_NE(fused, nullptr) << ir::to_text(g);
      EXPECT_EQ(update, nullptr) << ir::to_text(g);
      EXPECT_EQ(fused->input(0), dy);
      EXPECT_EQ(fused->input(1), x);
      EXPECT_EQ(ir::node_precision(*fused), ir::Precision::F32);
    }
    const auto copies_made =
        std::count_if(g.nodes().begin(), g.nodes().end(),
                      [](const ir::Node* n) { return n->op() == "bf16_copy"; });
    EXPECT_EQ(copies_made, copies ? 3 : 0) << ir::to_text(g);
  }
}

// With momentum, a bf16 weight gradient a^T b folds into matmul_sgd_momentum where its bf16
// kernel runs (AMX-BF16 or AVX512-BF16): the fused node is marked bf16 and reads the bf16 copies.
// A product of another form (dy w, the data gradient) never folds.
TEST(Precision, Bf16WeightGradientsFoldIntoAMomentumUpdateWhereTheBf16KernelRuns) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {8, 32});
  ir::Value* dy = ops::input(g, "dy", {8, 4});
  ir::Value* w = ops::parameter(g, "w", Tensor::zeros({4, 32}));
  ir::Value* v = ops::parameter(g, "v", Tensor::zeros({4, 32}));
  g.add_output(ops::matmul(x, w, false, true));
  g.add_output(ops::matmul(dy, w));
  ir::Value* grad = ops::matmul(dy, x, true, false);
  ir::Value* lr = ops::input(g, "lr", {});
  ir::Node* update = ops::apply_node("sgd_momentum", {w, grad, v, lr}, {{"momentum", 0.9f}});
  for (ir::Value* out : update->outputs()) g.add_output(out);
  ops::MixedPrecision(ir::Precision::BF16).run(g);
  const bool marked = ir::node_precision(*grad->producer()) == ir::Precision::BF16;
  const std::string why = marked ? ops::bf16_momentum_refusal(*grad->producer()) : "not marked";
  EXPECT_EQ(ops::FuseUpdateIntoProduct().run(g), why.empty()) << why << "\n" << ir::to_text(g);
  const ir::Node* fused = nullptr;
  for (const ir::Node* n : g.nodes())
    if (n->op() == "matmul_sgd_momentum") fused = n;
  if (!why.empty()) {
    EXPECT_EQ(fused, nullptr) << ir::to_text(g);
    return;
  }
  ASSERT_NE(fused, nullptr) << ir::to_text(g);
  EXPECT_EQ(ir::node_precision(*fused), ir::Precision::BF16);
  EXPECT_EQ(fused->input(0)->producer()->op(), "bf16_copy");
  EXPECT_EQ(fused->input(1)->producer()->op(), "bf16_copy");
  runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
  const std::string table = exe.kernel_table();
  const auto line = table.find("matmul_sgd_momentum");
  ASSERT_NE(line, std::string::npos) << table;
  EXPECT_EQ(
      table.substr(line, table.find('\n', line) - line).find("-> native bf16") != std::string::npos,
      true)
      << table;
}

// The fused bf16 kernel against the unfused path on the same rounded factors: the f32 product
// (its sums in another order) and then the sgd_momentum op. Odd and even batches (a last pair with
// a zero partner; 69 samples, three runs of 32 on AMX), rows that fill no whole tile, 80 columns
// (a block of 64 and one of 16; five AMX tiles) and 272 (two strips of the update, 256 and 16),
// weight decay, Nesterov, f32 factors it rounds and bf16 ones; the same bits on 1 and 2 threads.
TEST(Precision, FusedBf16WeightGradientUpdatesAsTheUnfusedPath) {
  if (std::string why = native::tn_bf16_refusal(true, false, 272); !why.empty())
    GTEST_SKIP() << "the fused bf16 kernel " << why;
  const std::int64_t m = 10;
  for (const std::int64_t n : {80, 272})
    for (const std::int64_t batch : {7, 32, 69})
      for (const bool nesterov : {false, true})
        for (const bool stored_bf16 : {false, true}) {
          SCOPED_TRACE(fmt::format("columns {} batch {} nesterov {} factors {}", n, batch, nesterov,
                                   stored_bf16 ? "bf16" : "f32"));
          Tensor a = Tensor::empty({batch, m}), b = Tensor::empty({batch, n});
          Tensor p = Tensor::empty({m, n}), v = Tensor::empty({m, n});
          const CounterRng rng(29);
          rng.fill_normal(a, 1, 0.0f, 1.0f);
          rng.fill_normal(b, 2, 0.0f, 1.0f);
          rng.fill_normal(p, 3, 0.0f, 1.0f);
          rng.fill_normal(v, 4, 0.0f, 0.1f);
          const ir::Attrs update_attrs{
              {"momentum", 0.9f}, {"weight_decay", 0.01f}, {"nesterov", nesterov}};
          // The reference: g in f32 on the rounded factors, then the update op.
          ir::Graph rg;
          ir::Value* g = ops::matmul(ops::input(rg, "a", a.shape()), ops::input(rg, "b", b.shape()),
                                     true, false);
          ir::Node* ref_update =
              ops::apply_node("sgd_momentum",
                              {ops::input(rg, "p", p.shape()), g, ops::input(rg, "v", v.shape()),
                               ops::input(rg, "lr", {})},
                              update_attrs);
          for (ir::Value* out : ref_update->outputs()) rg.add_output(out);
          runtime::Executable ref(rg, {.backend = ir::Backend::Native});
          Tensor(ref.input("a")).copy_from(rounded_to_bf16(a));
          Tensor(ref.input("b")).copy_from(rounded_to_bf16(b));
          Tensor(ref.input("p")).copy_from(p);
          Tensor(ref.input("v")).copy_from(v);
          ref.input("lr").data<float>()[0] = 0.1f;
          ref.run();
          std::vector<std::vector<Tensor>> got;
          std::string kernels;
          const int saved = max_threads();
          for (const int threads : {1, 2}) {
            set_num_threads(threads);
            ir::Graph fg;
            ir::Value* av = ops::input(fg, "a", a.shape());
            ir::Value* bv = ops::input(fg, "b", b.shape());
            ir::Attrs attrs = update_attrs;
            attrs.set("trans_a", true);
            ir::Node* fused =
                ops::apply_node("matmul_sgd_momentum",
                                {av, bv, ops::input(fg, "p", p.shape()),
                                 ops::input(fg, "v", v.shape()), ops::input(fg, "lr", {})},
                                attrs);
            fused->annotations().set("precision", std::string("bf16"));
            if (stored_bf16) {
              av->set_stored(DType::BF16);
              bv->set_stored(DType::BF16);
            }
            for (ir::Value* out : fused->outputs()) fg.add_output(out);
            runtime::Executable exe(fg, {.backend = ir::Backend::OneDnn});
            store_input(a, exe.input("a"), stored_bf16);
            store_input(b, exe.input("b"), stored_bf16);
            Tensor(exe.input("p")).copy_from(p);
            Tensor(exe.input("v")).copy_from(v);
            exe.input("lr").data<float>()[0] = 0.1f;
            exe.run();
            kernels = exe.kernel_table();
            got.push_back(
                {exe.value(fused->output(0)).clone(), exe.value(fused->output(1)).clone()});
          }
          set_num_threads(saved);
          EXPECT_NE(kernels.find("-> native bf16"), std::string::npos) << kernels;
          for (int t = 0; t < 2; ++t) {
            SCOPED_TRACE(t == 0 ? "param" : "velocity");
            const Tensor& want = ref.value(ref_update->output(t));
            EXPECT_EQ(0, std::memcmp(got[0][t].raw(), got[1][t].raw(), want.nbytes()))
                << "1 and 2 threads differ";
            EXPECT_LT(relative_difference(got[0][t], want), 1e-6);
          }
        }
}

namespace {

/// A linear layer's three products: y = x w^T, dx = dy w, dw = dy^T x (x [8,16], w [4,16], dy
/// [8,4]); each of x, w and dy is a factor of two of them.
ir::Graph& linear_products(ir::Graph& g) {
  ir::Value* x = ops::input(g, "x", {8, 16});
  ir::Value* w = ops::input(g, "w", {4, 16});
  ir::Value* dy = ops::input(g, "dy", {8, 4});
  g.add_output(ops::matmul(x, w, false, true));
  g.add_output(ops::matmul(dy, w));
  g.add_output(ops::matmul(dy, x, true, false));
  return g;
}

/// The conversions to bf16 a step makes: one per bf16_copy node, and one per f32 factor of a
/// bf16 product (its kernel's reorder).
int conversions(const ir::Graph& g) {
  int count = 0;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == "bf16_copy") ++count;
    if (n->op() != "matmul" || ir::node_precision(*n) != ir::Precision::BF16) continue;
    for (int i = 0; i < 2; ++i) count += n->input(i)->stored() == DType::F32;
  }
  return count;
}

}  // namespace

TEST(Precision, SharedFactorsAreConvertedOncePerStep) {
  if (!MINIDL_WITH_ONEDNN) GTEST_SKIP() << "no kernel computes in bf16 without oneDNN";
  ir::Graph unshared, shared;
  linear_products(unshared);
  linear_products(shared);
  ops::MixedPrecision(ir::Precision::BF16, /*share_factors=*/false).run(unshared);
  ops::MixedPrecision(ir::Precision::BF16).run(shared);
  EXPECT_EQ(conversions(unshared), 6);
  EXPECT_EQ(conversions(shared), 3);
  // One copy of each of x, w and dy, before its first reader, stored as bf16 and read by both
  // of its products; the copies carry no precision mark (they compute nothing).
  int copies = 0;
  for (const ir::Node* n : shared.nodes()) {
    if (n->op() != "bf16_copy") continue;
    ++copies;
    EXPECT_EQ(n->output()->stored(), DType::BF16);
    EXPECT_EQ(n->output()->users().size(), 2u) << n->describe();
    EXPECT_EQ(n->annotations().find("precision"), nullptr);
    EXPECT_EQ(n->input(0)->users().size(), 1u) << n->input(0)->ref();
  }
  EXPECT_EQ(copies, 3);
  // A second run finds nothing left to share.
  EXPECT_EQ(ops::share_bf16_factors(shared), 0);
  // An f32 graph is left alone.
  ir::Graph f32;
  linear_products(f32);
  EXPECT_FALSE(ops::MixedPrecision(ir::Precision::F32).run(f32));
  EXPECT_EQ(f32.nodes().size(), 6u);
}

namespace {

/// The outputs of the graph `build` makes, run on oneDNN's kernels under bf16 without shared
/// factors ([0]) and with them ([1]), from the same inputs x, w and dy. No node of either runs
/// a native kernel but the copies.
std::array<std::vector<Tensor>, 2> unshared_and_shared(
    const std::function<void(ir::Graph&)>& build) {
  std::array<std::vector<Tensor>, 2> results;
  for (const bool share : {false, true}) {
    ir::Graph g;
    build(g);
    ops::MixedPrecision(ir::Precision::BF16, share).run(g);
    runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
    const std::string table = exe.kernel_table();
    if (share) {
      EXPECT_NE(table.find("bf16_copy"), std::string::npos) << table;
    }
    EXPECT_EQ(table.find("-> native\n"), std::string::npos) << table;
    std::uint64_t seed = 40;
    for (const char* name : {"x", "w", "dy"}) {
      Tensor in = exe.input(name);
      CounterRng(seed++).fill_normal(in, 0, 0.0f, 1.0f);
    }
    exe.run();
    for (ir::Value* out : g.outputs()) results[share].push_back(exe.value(out).clone());
  }
  return results;
}

}  // namespace

TEST(Precision, SharedBf16FactorsGiveTheProductsOfTheirOwnConversions) {
  if (std::string why = ops::bf16_unavailable(); !why.empty()) GTEST_SKIP() << "bf16 " << why;
  const auto results = unshared_and_shared(linear_products);
  // The same bf16 factors (the copy rounds as the reorders do), f32 sums: only the order of the
  // sums may differ between the kernels oneDNN picks for the two layouts.
  ASSERT_EQ(results[0].size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_LT(relative_difference(results[1][i], results[0][i]), 1e-5) << "output " << i;
}

namespace {

/// A convolution's three passes on an image x [2,3,8,8] and a weight w [16,3,3,3] (inputs from
/// outside the graph), with dy [2,16,8,8]: y = x (*) w, dx = dy (*)^T w, dw = dy (*) x. Each of
/// x, w and dy is a factor of two of them. Then the forward and the weight gradient again on an
/// activation a = relu(x): a factor made inside the graph.
void conv_passes(ir::Graph& g) {
  ir::Value* x = ops::input(g, "x", {2, 3, 8, 8});
  ir::Value* w = ops::input(g, "w", {16, 3, 3, 3});
  ir::Value* dy = ops::input(g, "dy", {2, 16, 8, 8});
  const ir::Attrs pad{{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}};
  g.add_output(ops::apply("conv2d", {x, w}, pad));
  g.add_output(ops::apply(
      "conv2d_bwd_data", {dy, w},
      {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"in_shape", ir::Ints{2, 3, 8, 8}}}));
  const ir::Attrs kernel{
      {"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"kernel", ir::Ints{3, 3}}};
  g.add_output(ops::apply("conv2d_bwd_weights", {dy, x}, kernel));
  ir::Value* a = ops::relu(x);
  g.add_output(ops::apply("conv2d", {a, w}, pad));
  g.add_output(ops::apply("conv2d_bwd_weights", {dy, a}, kernel));
}

}  // namespace

TEST(Precision, ConvolutionsShareTheFactorsGivenFromOutside) {
  if (!MINIDL_WITH_ONEDNN) GTEST_SKIP() << "no kernel computes in bf16 without oneDNN";
  ir::Graph g;
  conv_passes(g);
  ops::MixedPrecision(ir::Precision::BF16).run(g);
  // One copy each of x, w and dy (graph inputs, plain), read by all their bf16 passes; none of
  // the activation relu(x), whose layout the layouts pass chooses later.
  std::map<std::string, std::size_t> readers;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() != "bf16_copy") continue;
    EXPECT_EQ(n->output()->stored(), DType::BF16);
    readers[n->input(0)->producer()->name()] = n->output()->users().size();
  }
  EXPECT_EQ(readers, (std::map<std::string, std::size_t>{{"x", 2}, {"w", 3}, {"dy", 3}}))
      << ir::to_text(g);
  for (const ir::Node* n : g.nodes())
    if (n->op() == "relu") {
      EXPECT_EQ(n->output()->users().size(), 2u) << ir::to_text(g);
    }
}

TEST(Precision, SharedBf16FactorsGiveTheConvolutionsTheSameResults) {
  if (std::string why = ops::bf16_unavailable(); !why.empty()) GTEST_SKIP() << "bf16 " << why;
  const auto results = unshared_and_shared(conv_passes);
  // The copy rounds as oneDNN's reorders do, and the passes run the same primitives on the same
  // bf16 factors: the same bits.
  ASSERT_EQ(results[0].size(), 5u);
  for (std::size_t i = 0; i < 5; ++i)
    EXPECT_EQ(relative_difference(results[1][i], results[0][i]), 0.0) << "output " << i;
}

TEST(Precision, AnF32ProductDeclinesAFactorStoredAsBf16) {
  if (!MINIDL_WITH_ONEDNN) GTEST_SKIP() << "no kernel takes bf16 values without oneDNN";
  ir::Graph g;
  linear_products(g);
  ops::MixedPrecision(ir::Precision::BF16).run(g);
  // The forward product marked f32 by hand: it cannot read the shared bf16 copy.
  ir::Node* forward = g.outputs()[0]->producer();
  forward->annotations().set("precision", std::string("f32"));
  const ir::KernelChoice c = ir::kernel_for(*forward, ir::Backend::OneDnn);
  EXPECT_EQ(c.kernel, nullptr);
  EXPECT_NE(c.declined.find("stored as bf16"), std::string::npos) << c.declined;
}

// The bf16 product on AMX tiles (native/gemm_amx.hpp) against the f32 kernel on the same rounded
// factors: equal but for the order of the sums. A linear layer's forward (b transposed and read
// in place, y^T computed; a batch of 20, a last tile of 4 columns), a read in place with b packed
// in pairs of rows (40 columns), fc2's forward (10 outputs: a in place, b's rows gathered), a
// transposed a stored as f32 (rounded while packed), three runs of 32 terms; bias and ReLU; the
// same bits on 1 and 2 threads. Where the factor read in place has at most 64 rows, the other is
// packed inside the loop in strips of column tiles: a data gradient's shape (a [32, 96] in place,
// b [96, 4100] packed across its rows, several strips, a last tile of 4 columns) and b stored as
// f32; with more rows, all of it first (a forward of 80 outputs). A factor of more rows read in
// place that is not the larger declines.
TEST(Precision, AmxBf16ProductsMatchF32OnRoundedFactors) {
  if (std::string why = native::amx_bf16_unavailable(); !why.empty())
    GTEST_SKIP() << "the AMX product " << why;
  struct Case {
    bool ta, tb;
    Shape a, b;
    bool a_bf16, b_bf16, bias, relu;
  };
  const Case cases[] = {
      {false, true, {20, 64}, {48, 64}, true, true, true, true},
      {false, false, {48, 96}, {96, 40}, true, true, false, false},
      {false, true, {16, 64}, {10, 64}, true, true, true, false},
      {true, true, {64, 16}, {16, 64}, false, true, false, true},
      {false, true, {48, 96}, {32, 96}, true, true, true, false},
      {false, false, {32, 96}, {96, 4100}, true, true, false, false},
      {false, false, {64, 64}, {64, 200}, true, false, true, true},
      {false, true, {20, 64}, {80, 64}, true, true, true, false},
  };
  EXPECT_NE(native::gemm_amx_refusal({.M = 80, .N = 256, .K = 96, .a_bf16 = true, .b_bf16 = true})
                .find("needs the larger factor"),
            std::string::npos);
  for (const Case& c : cases) {
    SCOPED_TRACE(
        fmt::format("a {}{} b {}{}", c.a.str(), c.ta ? "^T" : "", c.b.str(), c.tb ? "^T" : ""));
    Tensor a = Tensor::empty(c.a), b = Tensor::empty(c.b);
    const std::int64_t n = c.tb ? c.b[0] : c.b[1];
    Tensor bias = Tensor::empty({n});
    CounterRng(41).fill_normal(a, 1, 0.0f, 1.0f);
    CounterRng(41).fill_normal(b, 2, 0.0f, 1.0f);
    CounterRng(41).fill_normal(bias, 3, 0.0f, 1.0f);
    const ir::Attrs attrs{{"trans_a", c.ta},
                          {"trans_b", c.tb},
                          {"activation", std::string(c.relu ? "relu" : "none")}};
    std::vector<Tensor> rounded{rounded_to_bf16(a), rounded_to_bf16(b)};
    if (c.bias) rounded.push_back(bias);
    const Tensor want = run_node("matmul", rounded, attrs, ir::Backend::Native, ir::Precision::F32);
    std::vector<Tensor> got;
    std::string kernels;
    const int saved = max_threads();
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      ir::Graph g;
      ir::Value* av = ops::input(g, "a", c.a);
      ir::Value* bv = ops::input(g, "b", c.b);
      std::vector<ir::Value*> inputs{av, bv};
      if (c.bias) inputs.push_back(ops::input(g, "bias", {n}));
      ir::Node* mm = ops::apply_node("matmul", inputs, attrs);
      mm->annotations().set("precision", std::string("bf16"));
      if (c.a_bf16) av->set_stored(DType::BF16);
      if (c.b_bf16) bv->set_stored(DType::BF16);
      g.add_output(mm->output(0));
      runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
      store_input(a, exe.input("a"), c.a_bf16);
      store_input(b, exe.input("b"), c.b_bf16);
      if (c.bias) Tensor(exe.input("bias")).copy_from(bias);
      exe.run();
      kernels = exe.kernel_table();
      got.push_back(exe.value(mm->output(0)).clone());
    }
    set_num_threads(saved);
    EXPECT_NE(kernels.find("-> native bf16"), std::string::npos) << kernels;
    EXPECT_EQ(0, std::memcmp(got[0].raw(), got[1].raw(), want.nbytes()))
        << "1 and 2 threads differ";
    EXPECT_LT(relative_difference(got[0], want), 1e-5);
  }
}
