#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "minidl/core/denormals.hpp"
#include "minidl/core/threading.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

using namespace minidl;

namespace {

constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;

/// MXCSR's FTZ and DAZ bits on every thread of a parallel region of n threads.
std::vector<unsigned> bits_on_threads(int n) {
  std::vector<unsigned> bits(static_cast<std::size_t>(n), ~0u);
#pragma omp parallel num_threads(n)
  bits[static_cast<std::size_t>(omp_get_thread_num())] = _mm_getcsr() & (kFtz | kDaz);
  return bits;
}

/// Restores the process's mode and thread count when a test ends.
struct Restore {
  int threads = max_threads();
  ~Restore() {
    set_denormals(Denormals::Keep);
    set_num_threads(threads);
  }
};

}  // namespace

TEST(Denormals, FlushIsSetOnEveryThread) {
  Restore restore;
  set_num_threads(3);
  set_denormals(Denormals::Flush);
  EXPECT_TRUE(flushing_denormals());
  EXPECT_EQ(denormals_mode(), Denormals::Flush);
  for (unsigned b : bits_on_threads(3)) EXPECT_EQ(b, kFtz | kDaz);
  // A larger pool: the threads OpenMP adds now have it too.
  set_num_threads(5);
  const std::vector<unsigned> grown = bits_on_threads(5);
  ASSERT_EQ(static_cast<int>(grown.size()), 5);
  for (unsigned b : grown) EXPECT_EQ(b, kFtz | kDaz);
  // A std::thread started afterwards (like the trainer's prefetch thread) inherits it.
  unsigned thread_bits = 0;
  std::thread([&] { thread_bits = _mm_getcsr() & (kFtz | kDaz); }).join();
  EXPECT_EQ(thread_bits, kFtz | kDaz);

  set_denormals(Denormals::Keep);
  EXPECT_FALSE(flushing_denormals());
  for (unsigned b : bits_on_threads(5)) EXPECT_EQ(b, 0u);
  std::thread([&] { thread_bits = _mm_getcsr() & (kFtz | kDaz); }).join();
  EXPECT_EQ(thread_bits, 0u);
}

TEST(Denormals, FlushZeroesSubnormalResultsAndOperandsOnEveryThread) {
  Restore restore;
  set_num_threads(3);
  // volatile: computed at run time on each thread, not folded by the compiler.
  volatile float tiny = 1e-30f, small = 1e-10f;
  volatile float subnormal = std::bit_cast<float>(std::uint32_t{0x00000100u});  // 2^-141
  struct Result {
    float product, operand;
  };
  auto compute = [&] {
    std::vector<Result> r(3);
#pragma omp parallel num_threads(3)
    r[static_cast<std::size_t>(omp_get_thread_num())] = {tiny * small, subnormal * 1.0f};
    return r;
  };
  set_denormals(Denormals::Keep);
  for (const Result& r : compute()) {
    EXPECT_EQ(std::fpclassify(r.product), FP_SUBNORMAL) << r.product;  // 1e-40
    EXPECT_EQ(std::fpclassify(r.operand), FP_SUBNORMAL) << r.operand;
  }
  set_denormals(Denormals::Flush);
  for (const Result& r : compute()) {
    EXPECT_EQ(r.product, 0.0f);  // FTZ: a subnormal result is 0
    EXPECT_EQ(r.operand, 0.0f);  // DAZ: a subnormal operand reads as 0
  }
}

#endif
