// Optimizers append their update nodes to the training graph, so one run of the graph is one
// whole step: forward, backward and update.
#pragma once

#include <string>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;  // 0: plain SGD, no state
  double weight_decay = 0.0;
};

/// SGD with optional momentum (PyTorch's form). Owns the momentum buffers, keyed by parameter
/// name, so every graph built for the same model (one per batch size) shares them.
class Sgd {
 public:
  explicit Sgd(SgdOptions options);
  /// Appends one update node per parameter (annotated phase=update).
  void apply(ir::Graph& g, const std::vector<ir::Value*>& params,
             const std::vector<ir::Value*>& grads);
  const SgdOptions& options() const { return options_; }
  /// Creates the state of every parameter (zero momentum buffers; nothing without momentum)
  /// before any graph is built, so a checkpoint can be loaded into it. apply() uses these
  /// buffers; it creates a missing one itself.
  void init_state(const NamedTensors& params);
  /// Optimizer state, named "<param>.momentum_buffer", in parameter order. The tensors share
  /// the optimizer's storage: copying into them sets the state (checkpoint::load).
  NamedTensors state() const;

 private:
  SgdOptions options_;
  NamedTensors velocity_;
};

}  // namespace minidl::optim
