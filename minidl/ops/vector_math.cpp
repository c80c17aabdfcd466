// libmvec's variants are declared for the vectoriser by glibc's <math.h> only under -ffast-math,
// so the declarations are repeated here, and this file compiles with -fno-math-errno (see
// ops/CMakeLists.txt): under errno semantics GCC keeps every call scalar, even in an omp simd
// loop. The loops run in the elementwise clones for AVX-512 and AVX2 as well as the baseline
// (MINIDL_ELEMENTWISE_CLONES), whose vector loops call libmvec's 16-, 8- and 4-lane functions.
#include "minidl/ops/vector_math.hpp"

#include <cmath>

#include "minidl/ops/common.hpp"

extern "C" {
__attribute__((simd("notinbranch"))) float expf(float) noexcept;
__attribute__((simd("notinbranch"))) float logf(float) noexcept;
__attribute__((simd("notinbranch"))) float tanhf(float) noexcept;
}

namespace minidl::ops::vmath {

MINIDL_ELEMENTWISE_CLONES void exp(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = expf(x[i]);
}

MINIDL_ELEMENTWISE_CLONES void log(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = logf(x[i]);
}

MINIDL_ELEMENTWISE_CLONES void tanh(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = tanhf(x[i]);
}

MINIDL_ELEMENTWISE_CLONES void sigmoid(const float* x, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float e = expf(-std::fabs(x[i]));
    y[i] = (x[i] >= 0.0f ? 1.0f : e) / (1.0f + e);
  }
}

}  // namespace minidl::ops::vmath
