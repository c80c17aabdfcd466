// ops/vector_math.hpp: libmvec's functions against the double-precision ones over a sweep (the
// vector bodies of every clone and their tails), and the special values exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "minidl/ops/vector_math.hpp"

namespace {

using Fn = void (*)(const float*, float*, std::int64_t);

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void expect_close(Fn fn, double (*ref)(double), double lo, double hi, const char* name) {
  constexpr std::int64_t kN = 10007;  // not a multiple of any vector width
  std::vector<float> x(kN), y(kN);
  for (std::int64_t i = 0; i < kN; ++i)
    x[i] = static_cast<float>(lo + (hi - lo) * static_cast<double>(i) / (kN - 1));
  fn(x.data(), y.data(), kN);
  for (std::int64_t i = 0; i < kN; ++i) {
    const double want = ref(x[i]);
    if (std::isinf(want) || std::abs(want) > std::numeric_limits<float>::max()) {
      ASSERT_EQ(y[i], static_cast<float>(want)) << name << "(" << x[i] << ")";
    } else {
      // libmvec promises 4 ulp (2^-21 relative); subnormal results get an absolute bound.
      ASSERT_NEAR(y[i], want, 1e-6 * std::abs(want) + 1e-40) << name << "(" << x[i] << ")";
    }
  }
}

std::vector<float> apply(Fn fn, std::vector<float> x) {
  std::vector<float> y(x.size());
  fn(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  return y;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

using namespace minidl::ops;

TEST(VectorMath, MatchesDoublePrecisionOverASweep) {
  expect_close(
      vmath::exp, [](double x) { return std::exp(x); }, -110.0, 100.0, "exp");
  expect_close(
      vmath::log, [](double x) { return std::log(x); }, 1e-30, 1e6, "log");
  expect_close(
      vmath::log, [](double x) { return std::log(x); }, 0.5, 2.0, "log");
  expect_close(
      vmath::tanh, [](double x) { return std::tanh(x); }, -20.0, 20.0, "tanh");
  expect_close(
      vmath::tanh, [](double x) { return std::tanh(x); }, -1e-3, 1e-3, "tanh");
  expect_close(vmath::sigmoid, sigmoid_ref, -120.0, 120.0, "sigmoid");
}

TEST(VectorMath, SpecialValues) {
  const auto e = apply(vmath::exp, {-kInf, kInf, kNaN, 0.0f, 100.0f, -200.0f});
  EXPECT_EQ(e[0], 0.0f);
  EXPECT_EQ(e[1], kInf);
  EXPECT_TRUE(std::isnan(e[2]));
  EXPECT_EQ(e[3], 1.0f);
  EXPECT_EQ(e[4], kInf);
  EXPECT_EQ(e[5], 0.0f);
  const auto l = apply(vmath::log, {0.0f, -1.0f, kInf, kNaN, 1.0f});
  EXPECT_EQ(l[0], -kInf);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(l[2], kInf);
  EXPECT_TRUE(std::isnan(l[3]));
  EXPECT_EQ(l[4], 0.0f);
  const auto t = apply(vmath::tanh, {-kInf, kInf, kNaN, 0.0f, -0.0f});
  EXPECT_EQ(t[0], -1.0f);
  EXPECT_EQ(t[1], 1.0f);
  EXPECT_TRUE(std::isnan(t[2]));
  EXPECT_EQ(t[3], 0.0f);
  EXPECT_TRUE(std::signbit(t[4]));
  const auto s = apply(vmath::sigmoid, {-kInf, kInf, kNaN, 0.0f});
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_TRUE(std::isnan(s[2]));
  EXPECT_EQ(s[3], 0.5f);
}
