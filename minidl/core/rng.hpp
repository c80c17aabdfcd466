// Seeded random numbers whose values depend only on (seed, stream, index), never on the number of
// threads that draw them: element i of a tensor gets the i-th value of its stream wherever it is
// computed. A sequential generator on the same mixer serves shuffles.
#pragma once

#include <cstdint>
#include <vector>

#include "minidl/core/tensor.hpp"

namespace minidl {

/// SplitMix64 finaliser: a bijective 64-bit mixer with good avalanche.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Counter-based: the value at (stream, index) is a pure function of seed, stream and index.
class CounterRng {
 public:
  explicit CounterRng(std::uint64_t seed) : seed_(seed) {}
  std::uint64_t bits(std::uint64_t stream, std::uint64_t index) const {
    return mix64(mix64(seed_ ^ mix64(stream + 0x9e3779b97f4a7c15ULL)) + index);
  }
  /// Uniform in [0, 1) with 24 random bits (exactly representable in f32).
  float uniform(std::uint64_t stream, std::uint64_t index) const {
    return static_cast<float>(bits(stream, index) >> 40) * 0x1.0p-24f;
  }
  /// Standard normal via Box-Muller on two uniforms drawn from index 2i and 2i+1.
  float normal(std::uint64_t stream, std::uint64_t index) const;

  /// Fills t (f32) with uniform values in [lo, hi), in parallel.
  void fill_uniform(Tensor& t, std::uint64_t stream, float lo, float hi) const;
  /// Fills t (f32) with normal values N(mean, stddev^2), in parallel.
  void fill_normal(Tensor& t, std::uint64_t stream, float mean, float stddev) const;

 private:
  std::uint64_t seed_;
};

/// Sequential generator for shuffles and other inherently ordered draws.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  /// Uniform integer in [0, n), unbiased (Lemire's method).
  std::uint64_t below(std::uint64_t n);
  std::uint64_t state() const { return state_; }

 private:
  std::uint64_t state_;
};

/// A uniformly random permutation of 0..n-1 (Fisher-Yates), fixed by seed.
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed);

}  // namespace minidl
