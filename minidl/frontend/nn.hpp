// Modules: the frontend's way of declaring a model. A module registers its parameters (trained),
// buffers (not trained, but saved and checkpointed) and child modules under local names
// ("weight", "fc1"); the module tree derives every full name as the dotted path from the root
// ("block1.fc1.weight", PyTorch's names) and refuses a local name that would make an unclean
// path. A module adds its nodes to a graph when called on a value.
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
/// Fills t by init from seed, the random stream chosen by stream_name (a parameter's full name).
void initialize(Tensor& t, Init init, std::int64_t fan_in, std::int64_t fan_out, std::uint64_t seed,
                std::string_view stream_name);

class Module : public train::Model {
 public:
  Module() = default;
  // A module is the node of a tree of modules that owns its children; it is not copied.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// Adds this module's nodes after x; returns the output value. A container calls its
  /// children as child(x), not child.forward(x).
  ir::Value* forward(ir::Value* x) override = 0;
  /// forward(x) with the nodes named under this module's local name ("fc1.matmul" for a child
  /// "fc1" of the model, "block1.fc1.matmul" one level down).
  ir::Value* operator()(ir::Value* x);
  /// Short description, e.g. "Linear(784 -> 256)".
  std::string describe() const override = 0;

  /// Trained tensors by full name: this module's own in the order it registered them, then
  /// each child's, children in the order they were registered. The tensors share the
  /// module's storage.
  NamedTensors parameters() final;
  /// Buffers (state that is not trained: statistics, constants) by full name, in the same
  /// order. Graphs read them; autograd, the optimizer and the gradient reduction leave them out.
  NamedTensors buffers() final;
  /// The parameters stored as shards (Model::parameter_shards), by full name.
  std::vector<std::pair<std::string, train::ParameterShard>> parameter_shards() final;
  /// Stores the parameter of full name `name` as its part shard.index: the module that
  /// registered it keeps only a copy of that part, and graphs read it through read_parameter
  /// (train/model.hpp). Throws for an unknown name, a part that does not divide the shape, or a
  /// parameter stored as a shard already.
  void shard_parameter(const std::string& name, const train::ParameterShard& shard) final;
  void unshard_parameter(const std::string& name, const Tensor& whole) final;
  /// Parameters, then buffers: what --save writes and --init reads (PyTorch's state_dict).
  NamedTensors state_dict();

  /// (Re)initialises every module of the tree from seed (each one's reset_parameters); the
  /// result depends on seed and the full names only.
  void reset(std::uint64_t seed);

  /// The module's full dotted name ("features.fc1"), derived from where it sits in the tree;
  /// "" for the root (the model itself) and for a module not placed in a model yet.
  const std::string& name() const { return path_; }

  /// Training mode (on, the default) or evaluation mode, as PyTorch's Module.train(mode), for
  /// the whole tree: it decides what forward() adds to the graph being built (Dropout adds
  /// nothing when off), so the Trainer sets it before it builds each training or evaluation
  /// graph.
  void train(bool on = true) final;
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  /// Registers t as a parameter called `name` and returns it (a handle sharing its storage).
  /// A name is one segment of the dotted path: letters, digits and '_', unique among this
  /// module's parameters, buffers and children. Anything else is refused, naming the module
  /// and the name.
  Tensor register_parameter(std::string name, Tensor t);
  /// Registers t as a buffer called `name` (the same rules) and returns it.
  Tensor register_buffer(std::string name, Tensor t);
  /// Makes m a child called `name` (the same rules) and returns it; its parameters are then
  /// "<name>.<theirs>" below this module's name.
  template <typename M>
  M& register_module(std::string name, std::unique_ptr<M> m) {
    M* raw = m.get();
    adopt(std::move(name), std::move(m));
    return *raw;
  }

  /// The node of the registered parameter `name` in g, named by its full name (created once
  /// per graph, so every use of a weight reads the same node).
  ir::Value* parameter_value(ir::Graph& g, std::string_view name);
  /// The node of the registered buffer `name` in g: persistent, read-only for the graph, never
  /// differentiated.
  ir::Value* buffer_value(ir::Graph& g, std::string_view name);
  /// Initialises the registered parameter `name` by init from seed, the random stream fixed by
  /// its full name.
  void initialize_parameter(std::string_view name, Init init, std::int64_t fan_in,
                            std::int64_t fan_out, std::uint64_t seed);
  /// The registered parameter `name` (its storage: a shard's part once sharded).
  const Tensor& registered_parameter(std::string_view name) const;

  /// What reset(seed) does for this module alone: initialise its own parameters (its
  /// children's reset_parameters are called by reset). The default leaves them as registered.
  virtual void reset_parameters(std::uint64_t seed) {}

  struct Child {
    std::string name;  // the local name
    std::unique_ptr<Module> module;
  };
  const std::vector<Child>& children() const { return children_; }

 private:
  void adopt(std::string name, std::unique_ptr<Module> m);
  /// Throws unless name may be registered as a new `kind` of this module.
  void check_new_name(std::string_view kind, const std::string& name) const;
  void set_path(const std::string& path);
  std::string full_name(std::string_view local) const;
  void collect(bool buffers, NamedTensors& out) const;
  ir::Value* source_value(ir::Graph& g, bool buffer, std::string_view name);
  /// The module of the tree that registered the parameter of full name `name` (this one when no
  /// child's name prefixes it).
  Module* owner_of(const std::string& name);
  /// The module for error messages: its type and, once placed, its full name.
  std::string who() const;

  std::string local_name_, path_;
  bool training_ = true;
  NamedTensors parameters_, buffers_;
  std::vector<std::pair<std::string, train::ParameterShard>> shards_;  // by local name
  std::vector<Child> children_;
};

/// y = x W^T + b, W [out, in], b [out].
class Linear final : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, Init init = Init::He, bool bias = true);
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;
  const Tensor& weight() const { return registered_parameter("weight"); }
  /// Null storage without a bias.
  Tensor bias() const { return has_bias_ ? registered_parameter("bias") : Tensor(); }

 private:
  void reset_parameters(std::uint64_t seed) override;

  std::int64_t in_, out_;
  Init init_;
  bool has_bias_;
};

/// 2-D convolution over x [N, in, H, W] as PyTorch's Conv2d: weight [out, in, kernel, kernel],
/// bias [out] (added by a separate bias_add node), zero padding `pad` on each side. He and
/// Xavier take fan_in = in * kernel * kernel and fan_out = out * kernel * kernel.
class Conv2d final : public Module {
 public:
  Conv2d(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel,
         std::int64_t stride = 1, std::int64_t pad = 0, Init init = Init::He, bool bias = true);
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;
  const Tensor& weight() const { return registered_parameter("weight"); }
  /// Null storage without a bias.
  Tensor bias() const { return has_bias_ ? registered_parameter("bias") : Tensor(); }

 private:
  void reset_parameters(std::uint64_t seed) override;

  std::int64_t in_, out_, kernel_, stride_, pad_;
  Init init_;
  bool has_bias_;
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

/// Average pooling to a fixed output size, as PyTorch's AdaptiveAvgPool2d(output_size): x [N, C,
/// H, W] -> y [N, C, OH, OW]. AdaptiveAvgPool2d(1) is global average pooling ([N, C, 1, 1]).
/// Implemented as avg_pool2d with kernel = stride = (H / OH, W / OW), so oneDNN's pooling and
/// blocked layout serve it; it therefore takes only inputs whose H and W are multiples of OH and
/// OW (PyTorch's windows are then the same) and refuses others, naming the sizes.
class AdaptiveAvgPool2d final : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::int64_t output_size = 1)
      : AdaptiveAvgPool2d(output_size, output_size) {}
  AdaptiveAvgPool2d(std::int64_t output_h, std::int64_t output_w);
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;

 private:
  std::int64_t oh_, ow_;
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

/// Batch normalization over the channels (dimension 1) as PyTorch's BatchNorm1d / BatchNorm2d,
/// with its names, defaults and state_dict: parameters `weight` (ones) and `bias` (zeros) when
/// affine, buffers `running_mean` (zeros), `running_var` (ones) and `num_batches_tracked` (i64,
/// shape []) when tracking running statistics.
///
/// Training mode normalises by the batch's statistics: bn_stats -> bn_moments -> batch_norm,
/// and, when tracking, bn_update_running from the statistics summed over every replica and
/// rank (cross_replica_sum, key "<name>.stats"): the running statistics are those of the global
/// batch, updated once per step (a graph that holds one forward per thread replica gets one
/// update, the first forward's). Evaluation mode normalises by the running statistics; without
/// them (track_running_stats = false) by the batch's in both modes, as PyTorch does.
class BatchNorm : public Module {
 public:
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;
  std::int64_t num_features() const { return features_; }

 protected:
  /// kind: "BatchNorm1d" or "BatchNorm2d"; ranks: the input ranks it takes.
  BatchNorm(std::string kind, std::vector<int> ranks, std::int64_t num_features, double eps,
            double momentum, bool affine, bool track_running_stats);

 private:
  void reset_parameters(std::uint64_t seed) override;
  /// x [N,C] or [N,C,H,W] -> y, the ops above.
  ir::Value* normalize(ir::Value* x);

  std::string kind_;
  std::vector<int> ranks_;
  std::int64_t features_;
  double eps_, momentum_;
  bool affine_, track_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
};

/// BatchNorm over x [N, C] or [N, C, L] (as PyTorch's BatchNorm1d).
class BatchNorm1d final : public BatchNorm {
 public:
  explicit BatchNorm1d(std::int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm("BatchNorm1d", {2, 3}, num_features, eps, momentum, affine, track_running_stats) {
  }
};

/// BatchNorm over x [N, C, H, W] (as PyTorch's BatchNorm2d).
class BatchNorm2d final : public BatchNorm {
 public:
  explicit BatchNorm2d(std::int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm("BatchNorm2d", {4}, num_features, eps, momentum, affine, track_running_stats) {}
};

/// Children applied in order; each child's parameters are named "<child name>.<param>".
class Sequential final : public Module {
 public:
  Sequential() = default;
  /// Adds a child called name (default: its index), under the rules of register_module.
  Sequential& add(std::unique_ptr<Module> m, std::string name = {});
  template <typename M, typename... Args>
  Sequential& emplace(std::string name, Args&&... args) {
    return add(std::make_unique<M>(std::forward<Args>(args)...), std::move(name));
  }
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;
  std::size_t size() const { return children().size(); }
};

/// A residual block: y = post(body(x) + shortcut(x)), as the blocks of ResNet (He et al. 2016).
/// The body is the children added with add/emplace, applied in order; the shortcut is the child
/// set_shortcut registers (called "shortcut" unless named otherwise), the identity when not
/// set; post is the children added with add_post/emplace_post, applied to the sum in order
/// (ResNet's last ReLU). Every child sits directly under the block, so a block written as
///
///   auto block = std::make_unique<nn::Residual>();
///   block->emplace<nn::Conv2d>("conv1", 16, 32, 3, 2, 1, nn::Init::He, false);
///   block->emplace<nn::ReLU>("relu1");
///   block->emplace<nn::Conv2d>("conv2", 32, 32, 3, 1, 1, nn::Init::He, false);
///   block->set_shortcut(std::make_unique<nn::Conv2d>(16, 32, 1, 2, 0, nn::Init::He, false));
///   block->emplace_post<nn::ReLU>("relu");
///
/// has torchvision's names: "conv1.weight", "conv2.weight", "shortcut.weight" below the block's
/// own name. The sum is the node "<block>.add"; forward refuses a body and a shortcut whose
/// outputs differ in shape, naming both.
class Residual final : public Module {
 public:
  Residual() = default;
  /// Appends m to the body, called name (default: its index among all children).
  Residual& add(std::unique_ptr<Module> m, std::string name = {});
  template <typename M, typename... Args>
  Residual& emplace(std::string name, Args&&... args) {
    return add(std::make_unique<M>(std::forward<Args>(args)...), std::move(name));
  }
  /// Makes m the shortcut (once), called name.
  Residual& set_shortcut(std::unique_ptr<Module> m, std::string name = "shortcut");
  /// Appends m to what runs after the sum, called name (default: its index among all children).
  Residual& add_post(std::unique_ptr<Module> m, std::string name = {});
  template <typename M, typename... Args>
  Residual& emplace_post(std::string name, Args&&... args) {
    return add_post(std::make_unique<M>(std::forward<Args>(args)...), std::move(name));
  }
  ir::Value* forward(ir::Value* x) override;
  std::string describe() const override;
  bool has_shortcut() const { return shortcut_ != nullptr; }

 private:
  Module& adopt_child(std::unique_ptr<Module> m, std::string name);

  std::vector<Module*> body_, post_;
  Module* shortcut_ = nullptr;
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
  std::string describe() const override;
  double p() const { return p_; }

 private:
  void reset_parameters(std::uint64_t seed) override;

  double p_;
  std::uint64_t seed_ = 0;
};

/// The activation module called name, one of activation_names().
std::unique_ptr<Module> make_activation(const std::string& name);
/// The names make_activation knows: relu, sigmoid, tanh.
std::vector<std::string> activation_names();

/// Copies values into the model's parameters and buffers (its state_dict), matched by name;
/// names, shapes and dtypes must all match, or the error, naming `source`, lists what differs.
void load_state_dict(Module& m, const NamedTensors& values, const std::string& source);
/// load_state_dict from a .safetensors file: what --init does.
void load_state_dict(Module& m, const std::string& path);
/// Writes the model's state_dict to path as .safetensors (PyTorch's names and layouts, written
/// to a temporary file and renamed): what --save does.
void save_state_dict(Module& m, const std::string& path);

}  // namespace minidl::nn
