// dropout: the harness (shapes, gradient dx = dy * mask, bad p and key), the mask against the
// formula of ops/nn/dropout.cpp computed here, and the property that makes it independent of how
// a batch is split: a batch's mask is the concatenation of its slices' masks.
#include <gmock/gmock.h>

#include <cmath>
#include <cstring>

#include "harness.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

namespace {

ir::Attrs dropout_attrs(double p, std::int64_t seed = 7) { return {{"p", p}, {"seed", seed}}; }

}  // namespace

// The key is drawn from [0, 1000): any (step, first sample) is valid.
static const std::vector<OpCase> kDropout = {
    OpCase()
        .shapes({{4, 9}, {2}})
        .dtypes({DType::F32, DType::I64})
        .ints_below(1000)
        .attrs(dropout_attrs(0.3)),
    OpCase()
        .shapes({{2, 3, 5, 5}, {2}})
        .dtypes({DType::F32, DType::I64})
        .ints_below(1000)
        .attrs(dropout_attrs(0.5, 11)),
    OpCase().shapes({{3, 7}, {2}}).dtypes({DType::F32, DType::I64}).attrs(dropout_attrs(0.0)),
    OpCase().shapes({{1}, {2}}).dtypes({DType::F32, DType::I64}).attrs(dropout_attrs(0.9)),
};
static const std::vector<BadCase> kDropoutBad = {
    {{{4, 9}, {2}}, {DType::F32, DType::I64}, dropout_attrs(1.0), "p must be in [0, 1), got 1"},
    {{{4, 9}, {2}}, {DType::F32, DType::I64}, dropout_attrs(-0.1), "p must be in [0, 1), got -0.1"},
    {{{4, 9}, {2}}, {DType::F32, DType::I64}, dropout_attrs(NAN), "p must be in [0, 1), got nan"},
    {{{4, 9}, {3}},
     {DType::F32, DType::I64},
     dropout_attrs(0.5),
     "expected key i64 [2] = (step, global index of sample 0), got i64 [3]"},
    {{{4, 9}, {1, 2}}, {DType::F32, DType::I64}, dropout_attrs(0.5), "got i64 [1,2]"},
    {{{4, 9}, {2}}, {DType::F32, DType::I32}, dropout_attrs(0.5), "got i32 [2]"},
    {{{4, 9}, {2}}, {DType::I32, DType::I64}, dropout_attrs(0.5), "expected f32 x [N,...]"},
    {{{}, {2}}, {DType::F32, DType::I64}, dropout_attrs(0.5), "expected f32 x [N,...], got f32 []"},
};
MINIDL_OP_TEST(dropout, kDropout, kDropoutBad)

namespace {

struct DropoutRun {
  Tensor y, mask;
};

DropoutRun run_dropout(const Tensor& x, std::int64_t step, std::int64_t first, double p,
                       std::int64_t seed) {
  ir::Graph g;
  Tensor key = Tensor::from(Shape{2}, std::vector<std::int64_t>{step, first});
  auto [y, mask] = ops::dropout(ops::parameter(g, "x", x), ops::parameter(g, "key", key), p, seed);
  g.add_output(y);
  g.add_output(mask);
  runtime::Executable exe(g);
  exe.run();
  return {exe.value(y).clone(), exe.value(mask).clone()};
}

Tensor random_x(const Shape& s, std::uint64_t stream) {
  Tensor x = Tensor::empty(s);
  CounterRng(3).fill_normal(x, stream, 0.0f, 1.0f);
  return x;
}

/// Samples [begin, end) of t as a new tensor.
Tensor rows(const Tensor& t, std::int64_t begin, std::int64_t end) {
  Shape s = t.shape();
  const std::int64_t row = t.numel() / s[0];
  s[0] = end - begin;
  Tensor out = Tensor::empty(s);
  std::memcpy(out.raw(), t.data<float>() + begin * row, out.nbytes());
  return out;
}

}  // namespace

// The formula of the op file's header, written out here: stream = mix64(mix64(step) + sample),
// u = CounterRng(seed).uniform(stream, j), mask = u >= p ? 1 / (1 - p) : 0, y = x * mask.
TEST(Dropout, MatchesTheDocumentedFormula) {
  const std::int64_t n = 5, step = 12, first = 640, seed = 99;
  const double p = 0.4;
  const Tensor x = random_x({n, 3, 4, 5}, 1);
  const DropoutRun r = run_dropout(x, step, first, p, seed);
  const std::int64_t features = 60;
  const auto scale = static_cast<float>(1.0 / (1.0 - p));
  const CounterRng rng(seed);
  std::int64_t kept = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    const std::uint64_t stream = mix64(mix64(step) + static_cast<std::uint64_t>(first + s));
    for (std::int64_t j = 0; j < features; ++j) {
      const std::int64_t i = s * features + j;
      const float want = static_cast<double>(rng.uniform(stream, j)) >= p ? scale : 0.0f;
      ASSERT_EQ(r.mask.at(i), want) << "sample " << s << " feature " << j;
      ASSERT_EQ(r.y.at(i), x.at(i) * want) << "sample " << s << " feature " << j;
      kept += want != 0.0f;
    }
  }
  // About 1 - p of the 300 elements are kept (a binomial: 180 +- 8.5 is one standard deviation).
  EXPECT_GT(kept, 140);
  EXPECT_LT(kept, 220);
}

TEST(Dropout, KeepsAboutOneMinusPAndPreservesTheMean) {
  const Tensor x = Tensor::full({64, 4096}, 1.0f);
  for (double p : {0.1, 0.5, 0.8}) {
    SCOPED_TRACE(p);
    const DropoutRun r = run_dropout(x, 3, 0, p, 1);
    double kept = 0.0, sum = 0.0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      kept += r.mask.at(i) != 0.0f;
      sum += r.y.at(i);
    }
    const double n = static_cast<double>(x.numel());
    EXPECT_NEAR(kept / n, 1.0 - p, 0.01);
    EXPECT_NEAR(sum / n, 1.0, 0.02);
  }
}

TEST(Dropout, StepSampleAndSeedEachChangeTheMask) {
  const Tensor x = Tensor::full({2, 256}, 1.0f);
  const Tensor base = run_dropout(x, 5, 10, 0.5, 1).mask;
  for (const auto& [step, first, seed] :
       {std::tuple{6, 10, 1}, std::tuple{5, 11, 1}, std::tuple{5, 10, 2}}) {
    const Tensor other = run_dropout(x, step, first, 0.5, seed).mask;
    EXPECT_NE(std::memcmp(base.raw(), other.raw(), base.nbytes()), 0)
        << "step " << step << " first " << first << " seed " << seed;
  }
  const Tensor again = run_dropout(x, 5, 10, 0.5, 1).mask;
  EXPECT_EQ(std::memcmp(base.raw(), again.raw(), base.nbytes()), 0);
}

// What makes dropout independent of the data-parallel split: samples 0..n of a global batch
// keyed (step, first) get the same masks as the slices [0, k) keyed (step, first) and [k, n)
// keyed (step, first + k), whatever the threads.
TEST(Dropout, MaskOfABatchIsTheConcatenationOfItsHalves) {
  const std::int64_t n = 9, step = 41, first = 3200;
  const Tensor x = random_x({n, 2, 7, 3}, 2);
  const int saved = max_threads();
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    set_num_threads(threads);
    const DropoutRun whole = run_dropout(x, step, first, 0.3, 17);
    for (std::int64_t k : {1, 4, 8}) {
      const DropoutRun a = run_dropout(rows(x, 0, k), step, first, 0.3, 17);
      const DropoutRun b = run_dropout(rows(x, k, n), step, first + k, 0.3, 17);
      const std::size_t na = a.mask.nbytes();
      EXPECT_EQ(std::memcmp(whole.mask.raw(), a.mask.raw(), na), 0) << "first part, k " << k;
      EXPECT_EQ(std::memcmp(static_cast<const char*>(whole.mask.raw()) + na, b.mask.raw(),
                            b.mask.nbytes()),
                0)
          << "second part, k " << k;
      EXPECT_EQ(std::memcmp(static_cast<const char*>(whole.y.raw()) + na, b.y.raw(), b.y.nbytes()),
                0)
          << "second part of y, k " << k;
    }
  }
  set_num_threads(saved);
}

// A large tensor runs in parallel chunks that start inside a sample: the same bits as one thread.
TEST(Dropout, SameMaskForAnyThreadCount) {
  const Tensor x = random_x({3, 50000}, 4);
  const int saved = max_threads();
  set_num_threads(1);
  const Tensor one = run_dropout(x, 2, 7, 0.25, 5).mask;
  for (int threads : {2, 3, 4}) {
    set_num_threads(threads);
    const Tensor many = run_dropout(x, 2, 7, 0.25, 5).mask;
    EXPECT_EQ(std::memcmp(one.raw(), many.raw(), one.nbytes()), 0) << threads << " threads";
  }
  set_num_threads(saved);
}
