// Modules: the frontend's way of declaring a model. A module owns its parameters (named
// PyTorch-style, "fc1.weight") and adds its nodes to a graph when called on a value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/train/model.hpp"

namespace minidl::nn {

using minidl::NamedTensors;

/// Weight initialisers. fan_in / fan_out are the layer's input and output sizes.
enum class Init {
  He,      // normal, std sqrt(2 / fan_in): for layers followed by ReLU
  Xavier,  // uniform in +-sqrt(6 / (fan_in + fan_out)): for the output layer and sigmoid/tanh
  Zeros,
};
void initialize(Tensor& t, Init init, std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed,
                std::string_view name);

class Module : public train::Model {
 public:
  /// Adds this module's nodes after x; returns the output value.
  ir::Value* forward(ir::Value* x) override = 0;
  ir::Value* operator()(ir::Value* x) { return forward(x); }
  /// Parameters with their full names (prefix + own name), in a fixed order.
  virtual void collect_parameters(const std::string& prefix, NamedTensors& out) {}
  /// (Re)initialises every parameter from seed; the result depends on seed and names only.
  virtual void reset_parameters(std::uint64_t seed, const std::string& prefix) {}
  /// Short description, e.g. "Linear(784 -> 256)".
  std::string describe() const override = 0;

  NamedTensors parameters() override {
    NamedTensors out;
    collect_parameters("", out);
    return out;
  }
  void reset(std::uint64_t seed) { reset_parameters(seed, ""); }

 protected:
  /// The parameter node for t in x's graph (created once per graph), named full_name.
  static ir::Value* param_value(ir::Graph& g, const std::string& full_name, const Tensor& t);
  /// "prefix.name" or just name when there is no prefix.
  static std::string join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "." + name;
  }

 public:
  /// The module's full dotted name ("features.fc1"); parents set it on their children.
  virtual void set_name(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }

  /// Training mode (on, the default) or evaluation mode, as PyTorch's Module.train(mode): it
  /// decides what forward() adds to the graph being built (Dropout adds nothing when off), so
  /// the Trainer sets it before it builds each training or evaluation graph. Containers pass it
  /// on to their children.
  void train(bool on = true) override { training_ = on; }
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  std::string name_;
  bool training_ = true;
};

/// y = x W^T + b, W [out, in], b [out].
class Linear final : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, Init init = Init::He, bool bias = true);
  ir::Value* forward(ir::Value* x) override;
  void collect_parameters(const std::string& prefix, NamedTensors& out) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::int64_t in_, out_;
  Init init_;
  Tensor weight_, bias_;
};

/// 2-D convolution over x [N, in, H, W] as PyTorch's Conv2d: weight [out, in, kernel, kernel],
/// bias [out] (added by a separate bias_add node), zero padding `pad` on each side. He and
/// Xavier take fan_in = in * kernel * kernel and fan_out = out * kernel * kernel.
class Conv2d final : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
         std::int64_t stride = 1, std::int64_t pad = 0, Init init = Init::He, bool bias = true);
  ir::Value* forward(ir::Value* x) override;
  void collect_parameters(const std::string& prefix, NamedTensors& out) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  std::string describe() const override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  std::int64_t in_, out_, kernel_, stride_, pad_;
  Init init_;
  Tensor weight_, bias_;
};

/// Max pooling over kernel x kernel windows of x [N, C, H, W]; stride 0 means the kernel.
class MaxPool2d final : public Module {
 public:
  explicit MaxPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t pad = 0);
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;

 private:
  std::int64_t kernel_, stride_, pad_;
};

/// Average pooling over kernel x kernel windows of x [N, C, H, W]; stride 0 means the kernel.
/// count_include_pad (PyTorch's default, true) divides every window by kernel * kernel, padding
/// included; false divides by the number of input elements the window covers.
class AvgPool2d final : public Module {
 public:
  explicit AvgPool2d(std::int64_t kernel, std::int64_t stride = 0, std::int64_t pad = 0,
                     bool count_include_pad = true);
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;

 private:
  std::int64_t kernel_, stride_, pad_;
  bool count_include_pad_;
};

class ReLU final : public Module {
 public:
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override { return "ReLU"; }
};
class Sigmoid final : public Module {
 public:
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override { return "Sigmoid"; }
};
class Tanh final : public Module {
 public:
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override { return "Tanh"; }
};
/// [N, ...] -> [N, rest].
class Flatten final : public Module {
 public:
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override { return "Flatten"; }
};

/// Children applied in order; each child's parameters are named "<child name>.<param>".
class Sequential final : public Module {
 public:
  Sequential() = default;
  /// Adds a child named name (default: its index).
  Sequential& add(std::unique_ptr<Module> m, std::string name = {});
  template <typename M, typename... Args>
  Sequential& emplace(std::string name, Args&&... args) {
    return add(std::make_unique<M>(std::forward<Args>(args)...), std::move(name));
  }
  ir::Value* forward(ir::Value* x) override;
  void collect_parameters(const std::string& prefix, NamedTensors& out) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  std::string describe() const override;
  void set_name(std::string name) override;
  void train(bool on = true) override;
  std::size_t size() const { return children_.size(); }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

/// Inverted dropout, as PyTorch's nn.Dropout(p): in training mode each element is zeroed with
/// probability p and the others are scaled by 1 / (1 - p); in evaluation mode it is the
/// identity and adds no node. The mask is a pure function of (seed, step, global sample index,
/// feature) (ops/nn/dropout.cpp), so it does not depend on how a batch is split over ranks or
/// threads. The key is the graph input ops::rng_key (ir::Role::RngKey), added by the first Dropout
/// of a graph and shared by all; the nodes differ by their seed, which comes from reset(seed) and
/// the module's name.
class Dropout final : public Module {
 public:
  explicit Dropout(double p = 0.5);
  ir::Value* forward(ir::Value* x) override;
  void reset_parameters(std::uint64_t seed, const std::string& prefix) override;
  std::string describe() const override;
  double p() const { return p_; }

 private:
  double p_;
  std::uint64_t seed_ = 0;
};

/// The activation module called name: relu, sigmoid or tanh.
std::unique_ptr<Module> make_activation(const std::string& name);

/// Copies values into the model's parameters, matched by name; names, shapes and dtypes must
/// all match, or the error lists what differs.
void load_parameters(Module& m, const NamedTensors& values, const std::string& source);

}  // namespace minidl::nn
