// Modules with children and buffers, as docs/adding-a-layer.md writes them: a residual block and
// a shift by a buffer, and a small model with the shift; a small ResNet with BatchNorm.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <string>

#include "minidl/frontend/nn.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/ops.hpp"

namespace minidl::testing {

/// y = relu(x + fc2(relu(fc1(x)))) over x [N, features].
class ResidualBlock final : public nn::Module {
 public:
  ResidualBlock(std::int64_t features, std::int64_t hidden)
      : fc1_(register_module("fc1", std::make_unique<nn::Linear>(features, hidden))),
        fc2_(register_module("fc2",
                             std::make_unique<nn::Linear>(hidden, features, nn::Init::Xavier))) {}

  ir::Value* forward(ir::Value* x) override {
    ir::Value* h = ops::relu(fc1_(x));
    return ops::relu(ops::add(x, fc2_(h)));
  }
  std::string describe() const override {
    return fmt::format("ResidualBlock({}, {})", fc1_.describe(), fc2_.describe());
  }

 private:
  nn::Linear& fc1_;
  nn::Linear& fc2_;
};

/// y = x + offset over x [N, features], offset a buffer: the graph reads it, nothing trains it.
class Shift final : public nn::Module {
 public:
  explicit Shift(std::int64_t features)
      : offset_(register_buffer("offset", Tensor::zeros({features}))) {}
  ir::Value* forward(ir::Value* x) override {
    return ops::bias_add(x, buffer_value(x->graph(), "offset"));
  }
  std::string describe() const override { return "Shift"; }
  const Tensor& offset() const { return offset_; }

 private:
  Tensor offset_;
};

/// y = x + 1e-3 * (the sum of x over the whole global batch): a statistic of the batch, summed
/// across thread replicas and ranks by ops::cross_replica_sum (the way BatchNorm's are).
class GlobalShift final : public nn::Module {
 public:
  ir::Value* forward(ir::Value* x) override {
    ir::Value* total = ops::cross_replica_sum(ops::sum(x), "global_shift");
    return ops::add(
        x, x->graph()
               .add_node(ops::op_expand, {total}, {{"shape", x->shape().dims()}, {"alpha", 1e-3}})
               ->output());
  }
  std::string describe() const override { return "GlobalShift"; }
};

/// 64 -> 32 -> global shift -> relu -> 10 over [N,1,8,8]: its forward and backward each need the
/// whole batch's sum.
inline std::unique_ptr<nn::Sequential> globally_shifted_mlp(std::uint64_t seed = 3) {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
  m->emplace<GlobalShift>("shift");
  m->emplace<nn::ReLU>("act1");
  m->emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
  m->reset(seed);
  return m;
}

/// 64 -> 32 -> shift -> relu -> 10 over [N,1,8,8]; the shift's offset set to a fixed pattern.
inline std::unique_ptr<nn::Sequential> shifted_mlp(std::uint64_t seed = 3) {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
  m->emplace<Shift>("shift", 32);
  m->emplace<nn::ReLU>("act1");
  m->emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
  m->reset(seed);
  Tensor offset = m->buffers()[0].second;
  for (std::int64_t i = 0; i < offset.numel(); ++i)
    offset.data<float>()[i] = 0.05f * static_cast<float>(i % 5) - 0.1f;
  return m;
}

/// A small ResNet over [N,1,8,8]: conv -> BatchNorm -> relu, an identity block and a projection
/// block (each conv-bn-relu-conv-bn, + shortcut, relu), global average pooling, a linear layer
/// without bias.
inline std::unique_ptr<nn::Sequential> small_resnet(std::uint64_t seed = 4) {
  auto block = [](std::int64_t in, std::int64_t out, std::int64_t stride) {
    auto b = std::make_unique<nn::Residual>();
    b->emplace<nn::Conv2d>("conv1", in, out, 3, stride, 1, nn::Init::He, false);
    b->emplace<nn::BatchNorm2d>("bn1", out);
    b->emplace<nn::ReLU>("relu1");
    b->emplace<nn::Conv2d>("conv2", out, out, 3, 1, 1, nn::Init::He, false);
    b->emplace<nn::BatchNorm2d>("bn2", out);
    if (stride != 1 || in != out) {
      auto s = std::make_unique<nn::Sequential>();
      s->emplace<nn::Conv2d>("0", in, out, 1, stride, 0, nn::Init::He, false);
      s->emplace<nn::BatchNorm2d>("1", out);
      b->set_shortcut(std::move(s));
    }
    b->emplace_post<nn::ReLU>("relu");
    return b;
  };
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv1", 1, 8, 3, 1, 1, nn::Init::He, false);
  m->emplace<nn::BatchNorm2d>("bn1", 8);
  m->emplace<nn::ReLU>("relu");
  m->add(block(8, 8, 1), "block1");
  m->add(block(8, 16, 2), "block2");
  m->emplace<nn::AdaptiveAvgPool2d>("pool", 1);
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc", 16, 10, nn::Init::Xavier, false);
  m->reset(seed);
  return m;
}

}  // namespace minidl::testing
