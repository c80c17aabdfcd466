// What the step compiler needs of a model: its forward pass as graph nodes, its named
// parameters (trained) and buffers (carried by checkpoints, not trained), and a training /
// evaluation mode. nn::Module implements it; any other model type can.
#pragma once

#include <string>
#include <string_view>

#include "minidl/ir/graph.hpp"

namespace minidl::train {

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

}  // namespace minidl::train
