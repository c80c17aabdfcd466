#include <tuple>

#include "harness.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/native/gemm.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using minidl::DType;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<OpCase> kMatmulCases = {
    OpCase().shapes({{3, 4}, {4, 5}}),
    OpCase().shapes({{7, 13}, {13, 5}}),
    OpCase().shapes({{6, 9}, {11, 9}}).attrs({{"trans_b", true}}),
    OpCase().shapes({{9, 6}, {9, 11}}).attrs({{"trans_a", true}}),
    OpCase().shapes({{9, 6}, {11, 9}}).attrs({{"trans_a", true}, {"trans_b", true}}),
    OpCase().shapes({{1, 1}, {1, 1}}),
    OpCase().shapes({{33, 65}, {17, 65}}).attrs({{"trans_b", true}}),
    // Fused forms, as the fusion pass makes them: bias, bias + ReLU, ReLU alone.
    OpCase().shapes({{5, 7}, {7, 6}, {6}}),
    OpCase().shapes({{6, 9}, {11, 9}, {11}}).attrs({{"trans_b", true}, {"activation", "relu"}}),
    OpCase().shapes({{9, 6}, {9, 11}}).attrs({{"trans_a", true}, {"activation", "relu"}}),
    OpCase().shapes({{64, 40}, {33, 40}, {33}}).attrs({{"trans_b", true}, {"activation", "relu"}}),
};
static const std::vector<BadCase> kMatmulBad = {
    {{{3, 4}, {5, 6}}, {}, {}, "inner dimensions differ: 4 vs 5"},
    {{{2, 3, 4}, {4, 5}}, {}, {}, "expected 2-D operands"},
    {{{3, 4}, {4, 5}}, {DType::F32, DType::I32}, {}, "expected f32 operands"},
    {{{3, 4}, {4, 5}, {4}}, {}, {}, "bias must be [5] to match the output"},
    {{{3, 4}, {4, 5}},
     {},
     {{"activation", "gelu"}},
     "unknown activation 'gelu' (expected none or relu)"},
    {{{3, 4}, {4, 5}, {5}}, {DType::F32, DType::F32, DType::I32}, {}, "expected an f32 bias"},
};
MINIDL_OP_TEST(matmul, kMatmulCases, kMatmulBad)

static const std::vector<BadCase> kAccumulateBad = {
    {{{3, 4}, {4, 5}, {3, 4}}, {}, {}, "the accumulator is [3,4], not the product's [3,5]"},
    {{{3, 4}, {4, 5}, {3, 5}},
     {DType::F32, DType::F32, DType::I32},
     {},
     "expected an f32 accumulator"},
    {{{3, 4}, {5, 6}, {3, 6}}, {}, {}, "inner dimensions differ: 4 vs 5"},
};
// An in-place update without a gradient rule (like sgd): checked against its definition below.
MINIDL_OP_TEST(matmul_accumulate, std::vector<OpCase>{}, kAccumulateBad)

TEST(MatmulAccumulate, AddsTheScaledProductIntoTheAccumulatorInPlace) {
  using namespace minidl;
  const std::int64_t m = 13, n = 21, k = 9;
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      for (const auto& [alpha, beta] : {std::pair{-0.1f, 1.0f}, std::pair{0.5f, 0.25f}}) {
        SCOPED_TRACE(::testing::Message() << "trans_a " << ta << ", trans_b " << tb << ", alpha "
                                          << alpha << ", beta " << beta);
        Tensor a = Tensor::empty(ta ? Shape{k, m} : Shape{m, k});
        Tensor b = Tensor::empty(tb ? Shape{n, k} : Shape{k, n});
        Tensor c = Tensor::empty({m, n});
        const CounterRng rng(5);
        rng.fill_uniform(a, 1, -1.0f, 1.0f);
        rng.fill_uniform(b, 2, -1.0f, 1.0f);
        rng.fill_uniform(c, 3, -1.0f, 1.0f);
        const Tensor c0 = c.clone();
        ir::Graph g;
        ir::Node* node = g.add_node(
            ops::op("matmul_accumulate"),
            {ops::parameter(g, "a", a), ops::parameter(g, "b", b), ops::parameter(g, "c", c)},
            {{"trans_a", ta}, {"trans_b", tb}, {"alpha", alpha}, {"beta", beta}});
        g.add_output(node->output());
        runtime::Executable exe(g);
        exe.run();
        EXPECT_EQ(exe.value(node->output()).raw(), c.raw()) << "the result is not in place";
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t j = 0; j < n; ++j) {
            double dot = 0.0;
            for (std::int64_t p = 0; p < k; ++p)
              dot += static_cast<double>(ta ? a.at(p * m + i) : a.at(i * k + p)) *
                     (tb ? b.at(j * k + p) : b.at(p * n + j));
            const double want = alpha * dot + beta * c0.at(i * n + j);
            ASSERT_NEAR(c.at(i * n + j), want, 1e-5 + 1e-5 * std::abs(want)) << i << "," << j;
          }
        }
      }
    }
  }
}

static const std::vector<BadCase> kSgdMomentumBad = {
    {{{3, 4}, {4, 5}, {3, 4}, {3, 5}, {}},
     {},
     {{"momentum", 0.9}},
     "input 2 is [3,4], not the product's [3,5]"},
    {{{3, 4}, {4, 5}, {3, 5}, {3, 5}, {}},
     {DType::F32, DType::F32, DType::F32, DType::I32, DType::F32},
     {{"momentum", 0.9}},
     "input 3 must be f32"},
    {{{3, 4}, {4, 5}, {3, 5}, {3, 5}, {2}},
     {},
     {{"momentum", 0.9}},
     "input 4 (lr) must be a single f32 element"},
    {{{3, 4}, {5, 6}, {3, 6}, {3, 6}, {}}, {}, {{"momentum", 0.9}}, "inner dimensions differ"},
};
// An optimizer update without a gradient rule: checked against the unfused pair below.
MINIDL_OP_TEST(matmul_sgd_momentum, std::vector<OpCase>{}, kSgdMomentumBad)

namespace {

/// Parameter and velocity after `steps` updates from the gradient op(a) op(b): by the fused node,
/// or by a matmul and an sgd_momentum node (native kernels both).
std::pair<minidl::Tensor, minidl::Tensor> momentum_steps(bool fused, bool ta, bool tb,
                                                         std::int64_t m, std::int64_t n,
                                                         std::int64_t k,
                                                         const minidl::ir::Attrs& rule, int steps) {
  using namespace minidl;
  const CounterRng rng(9);
  Tensor a = Tensor::empty(ta ? Shape{k, m} : Shape{m, k});
  Tensor b = Tensor::empty(tb ? Shape{n, k} : Shape{k, n});
  Tensor p = Tensor::empty({m, n});
  rng.fill_uniform(a, 1, -1.0f, 1.0f);
  rng.fill_uniform(b, 2, -1.0f, 1.0f);
  rng.fill_uniform(p, 3, -1.0f, 1.0f);
  Tensor v = Tensor::zeros({m, n});
  ir::Graph g;
  ir::Value* va = ops::parameter(g, "a", a);
  ir::Value* vb = ops::parameter(g, "b", b);
  ir::Value* vp = ops::parameter(g, "p", p);
  ir::Value* vv = ops::state(g, "v", v);
  ir::Value* lr = ops::state(g, "lr", Tensor::full({}, 0.05f));
  ir::Attrs attrs = rule;
  if (fused) {
    attrs.set("trans_a", ta);
    attrs.set("trans_b", tb);
    g.add_node(ops::op("matmul_sgd_momentum"), {va, vb, vp, vv, lr}, attrs);
  } else {
    g.add_node(ops::op("sgd_momentum"), {vp, ops::matmul(va, vb, ta, tb), vv, lr}, attrs);
  }
  runtime::Executable exe(g, {.backend = ir::Backend::Native});
  for (int s = 0; s < steps; ++s) exe.run();
  return {p, v};
}

}  // namespace

TEST(MatmulSgdMomentum, UpdatesAsTheProductThenSgdMomentum) {
  // K = 32 takes the GEMM's update store on AVX-512; K = 300 (past one cache block) and the
  // generic micro-kernel compute the gradient block by block instead. Both in a row split
  // (4096 x 256, 900 x 50) and a column split (256 x 4096, 40 x 700).
  using namespace minidl;
  struct RestoreIsa {
    ~RestoreIsa() { native::sgemm_force_isa(nullptr); }
  } restore;
  for (const char* isa : {"", "generic"}) {
    native::sgemm_force_isa(isa);
    for (const auto& [m, n, k] :
         {std::tuple{40, 700, 32}, std::tuple{900, 50, 300}, std::tuple{256, 4096, 32},
          std::tuple{4096, 256, 32}, std::tuple{5, 3, 7}}) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          for (const bool nesterov : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << "isa '" << isa << "' " << m << "x" << n << "x" << k << " ta " << ta
                         << " tb " << tb << " nesterov " << nesterov);
            const ir::Attrs rule{
                {"momentum", 0.9}, {"nesterov", nesterov}, {"weight_decay", nesterov ? 0.01 : 0.0}};
            const auto [p, v] = momentum_steps(true, ta, tb, m, n, k, rule, 3);
            const auto [want_p, want_v] = momentum_steps(false, ta, tb, m, n, k, rule, 3);
            for (std::int64_t i = 0; i < p.numel(); ++i) {
              ASSERT_NEAR(v.at(i), want_v.at(i), 1e-5f + 1e-5f * std::abs(want_v.at(i))) << i;
              ASSERT_NEAR(p.at(i), want_p.at(i), 1e-5f + 1e-5f * std::abs(want_p.at(i))) << i;
            }
          }
        }
      }
    }
  }
}
