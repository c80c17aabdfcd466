#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "minidl/core/rng.hpp"
#include "minidl/core/tensor.hpp"
#include "minidl/core/threading.hpp"

using namespace minidl;
using ::testing::HasSubstr;

TEST(Tensor, StorageIs64ByteAligned) {
  for (std::int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::empty({n});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u);
  }
}

TEST(Tensor, ShapeAndDtype) {
  Tensor t = Tensor::zeros({2, 3}, DType::I64);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.shape().str(), "[2,3]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(t.data<std::int64_t>()[5], 0);
}

TEST(Tensor, CopiesShareCloneCopies) {
  Tensor a = Tensor::full({4}, 1.0f);
  Tensor b = a;
  Tensor c = a.clone();
  a.data<float>()[0] = 5.0f;
  EXPECT_EQ(b.at(0), 5.0f);
  EXPECT_EQ(c.at(0), 1.0f);
}

TEST(Tensor, ReshapeChecksElementCount) {
  Tensor a = Tensor::zeros({2, 6});
  EXPECT_EQ(a.reshaped({3, 4}).shape(), (Shape{3, 4}));
  try {
    a.reshaped({5});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot reshape [2,6] (12 elements) to [5] (5 elements)"));
  }
}

TEST(Tensor, FromChecksCount) {
  EXPECT_THROW(Tensor::from(Shape{3}, std::vector<float>{1, 2}), Error);
}

TEST(Rng, CounterValuesDoNotDependOnThreadCount) {
  const int saved = max_threads();
  Tensor a = Tensor::empty({100000}), b = Tensor::empty({100000});
  set_num_threads(1);
  CounterRng(7).fill_normal(a, 3, 0.0f, 1.0f);
  set_num_threads(2);
  CounterRng(7).fill_normal(b, 3, 0.0f, 1.0f);
  set_num_threads(saved);
  for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.at(i), b.at(i));
}

TEST(Rng, NormalHasUnitMoments) {
  Tensor a = Tensor::empty({200000});
  CounterRng(1).fill_normal(a, 0, 0.0f, 1.0f);
  double m = 0, v = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m += a.at(i);
  m /= a.numel();
  for (std::int64_t i = 0; i < a.numel(); ++i) v += (a.at(i) - m) * (a.at(i) - m);
  v /= a.numel();
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.02);
}

TEST(Rng, SeedsAndStreamsDiffer) {
  EXPECT_NE(CounterRng(1).bits(0, 0), CounterRng(2).bits(0, 0));
  EXPECT_NE(CounterRng(1).bits(0, 0), CounterRng(1).bits(1, 0));
}

TEST(Rng, PermutationIsAPermutationFixedBySeed) {
  auto p = permutation(1000, 5);
  std::set<std::int64_t> s(p.begin(), p.end());
  EXPECT_EQ(s.size(), 1000u);
  EXPECT_EQ(*s.begin(), 0);
  EXPECT_EQ(*s.rbegin(), 999);
  EXPECT_EQ(p, permutation(1000, 5));
  EXPECT_NE(p, permutation(1000, 6));
}
