#include "minidl/core/rng.hpp"

#include <cmath>
#include <numeric>

namespace minidl {

float CounterRng::normal(std::uint64_t stream, std::uint64_t index) const {
  // u1 in (0, 1] so that log(u1) is finite.
  const double u1 = (static_cast<double>(bits(stream, 2 * index) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(bits(stream, 2 * index + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

void CounterRng::fill_uniform(Tensor& t, std::uint64_t stream, float lo, float hi) const {
  float* p = t.data<float>();
  const std::int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) p[i] = lo + (hi - lo) * uniform(stream, i);
}

void CounterRng::fill_normal(Tensor& t, std::uint64_t stream, float mean, float stddev) const {
  float* p = t.data<float>();
  const std::int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) p[i] = mean + stddev * normal(stream, i);
}

std::uint64_t Rng::below(std::uint64_t n) {
  MINIDL_ASSERT(n > 0);
  unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
  auto low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const std::uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next()) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  Rng rng(seed);
  for (std::int64_t i = n - 1; i > 0; --i) {
    std::swap(p[i], p[rng.below(static_cast<std::uint64_t>(i) + 1)]);
  }
  return p;
}

}  // namespace minidl
