#include "harness.hpp"
#include "minidl/core/rng.hpp"
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
      for (const auto [alpha, beta] : {std::pair{-0.1f, 1.0f}, std::pair{0.5f, 0.25f}}) {
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
