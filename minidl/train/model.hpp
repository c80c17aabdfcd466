// What the step compiler needs of a model: its forward pass as graph nodes, its named
// parameters (trained) and buffers (carried by checkpoints, not trained), and a training /
// evaluation mode. nn::Module implements it; any other model type can.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::train {

/// A parameter this rank stores as part `index` of `count` equal parts of its declared shape
/// `whole`, cut along `axis`: the part of this rank in communicator group `group`
/// (parallel::group), whose ranks hold the other parts in rank order. Tensor parallelism stores
/// the weights of the layers it splits so. A graph reads such a parameter whole through
/// tp_gather of its part over the group (read_parameter); the tensor-parallel pass reads the part
/// itself where it splits the layer, so a training step never gathers it. The optimizer's state
/// is shaped like the part; saving and checkpoints gather the whole (gather_parameters).
struct ParameterShard {
  Shape whole;
  int axis = 0;
  int index = 0;
  int count = 1;
  int group = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  /// Adds the model's nodes after x (its graph) and returns the output value.
  virtual ir::Value* forward(ir::Value* x) = 0;
  /// Trainable tensors by full name ("fc1.weight"), in a fixed order. The tensors share the
  /// model's storage, so every graph built for the model binds the same memory.
  virtual NamedTensors parameters() = 0;
  /// Non-trainable state (running statistics) by full name; checkpoints and saves carry it.
  virtual NamedTensors buffers() { return {}; }
  /// The parameters stored as shards, by full name; parameters() gives their parts. None by
  /// default.
  virtual std::vector<std::pair<std::string, ParameterShard>> parameter_shards() { return {}; }
  /// Stores parameter `name` as its part shard.index (a copy of that part of its current whole
  /// value, whose storage is released). The default refuses, naming the model.
  virtual void shard_parameter(const std::string& name, const ParameterShard& shard);
  /// Stores the sharded parameter `name` whole again, as a copy of `whole`. The default refuses.
  virtual void unshard_parameter(const std::string& name, const Tensor& whole);
  /// Training or evaluation mode: decides what forward() adds (dropout only when training).
  virtual void train(bool on) = 0;
  virtual std::string describe() const = 0;
};

/// Why `segment` cannot be one segment of a tensor's dotted name, or "" when it can: a segment
/// is made of letters, digits and '_' (so it holds no '.', and is not empty).
std::string name_segment_problem(std::string_view segment);

/// Throws unless every parameter and buffer name of model is a dotted path of such segments
/// ("block1.fc1.weight": no empty segment, no ".." or trailing dot), no two are equal and no two
/// share a tensor's storage, naming the model and the bad name. Checkpoints, saved files and the
/// optimizer's state all go by these names.
void check_names(Model& model);

/// The shard of parameter `name` in shards (from Model::parameter_shards), or null.
const ParameterShard* find_shard(const std::vector<std::pair<std::string, ParameterShard>>& shards,
                                 std::string_view name);

/// A graph's node of a parameter: a `parameter` node named `name` bound to storage, and, when
/// the storage is a shard, its tp_gather over the shard's group (named `name.whole`), which reads
/// it whole. Made once per graph: a second call returns the same value.
ir::Value* read_parameter(ir::Graph& g, const std::string& name, const Tensor& storage,
                          const ParameterShard* shard);

}  // namespace minidl::train
