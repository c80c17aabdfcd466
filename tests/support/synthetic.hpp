// Synthetic datasets for training tests: no files, fixed by a seed.
#pragma once

#include "minidl/core/rng.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/io/datasets.hpp"

namespace minidl::testing {

/// n samples of 10 classes, each a fixed random 8x8 pattern plus Gaussian noise.
inline Dataset blobs(std::int64_t n, std::uint64_t seed) {
  Dataset d;
  d.name = "blobs";
  d.images = Tensor::empty({n, 1, 8, 8});
  d.labels = Tensor::empty({n}, DType::I32);
  Tensor centers = Tensor::empty({10, 64});
  CounterRng(1).fill_uniform(centers, 0, 0.0f, 1.0f);
  Tensor noise = Tensor::empty({n, 64});
  CounterRng(seed).fill_normal(noise, 1, 0.0f, 0.35f);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::int32_t>(CounterRng(seed).bits(2, i) % 10);
    d.labels.data<std::int32_t>()[i] = c;
    for (int j = 0; j < 64; ++j)
      d.images.data<float>()[i * 64 + j] = centers.at(c * 64 + j) + noise.at(i * 64 + j);
  }
  return d;
}

/// 64-32-10 MLP over [N,1,8,8] inputs.
inline std::unique_ptr<nn::Sequential> small_mlp() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
  m->emplace<nn::ReLU>("act1");
  m->emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
  return m;
}

}  // namespace minidl::testing
