// Transcendental functions over float arrays, vectorised: exp, log, tanh and the logistic
// sigmoid of n elements, each element as glibc's vector math library (libmvec) computes it, in
// 16 lanes on AVX-512, 8 on AVX2 and 4 otherwise (chosen at run time). libmvec's functions are
// within 4 ulp of the exact result where the scalar libm ones are within 1, so their last bits
// differ from std::exp and friends. The native kernels of exp, log, tanh and sigmoid call these.
#pragma once

#include <cstdint>

namespace minidl::ops::vmath {

void exp(const float* x, float* y, std::int64_t n);
void log(const float* x, float* y, std::int64_t n);
void tanh(const float* x, float* y, std::int64_t n);
/// 1 / (1 + e) for x >= 0 and e / (1 + e) otherwise, with e = exp(-|x|): no exp overflows.
void sigmoid(const float* x, float* y, std::int64_t n);

}  // namespace minidl::ops::vmath
