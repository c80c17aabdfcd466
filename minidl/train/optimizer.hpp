// Optimizers append their update nodes to the training graph, so one run of the graph is one
// whole step: forward, backward and update. The learning rate and the optimizer step count are
// graph inputs (ir::Role::LearningRate, ir::Role::OptimizerStep) fed every step, so a schedule
// never recompiles. An optimizer owns its state tensors, keyed by parameter name, so every graph
// built for the same model (one per batch size) shares them and checkpoints carry them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::optim {

/// The per-step scalars every update reads: lr f32 [] and step i64 [] (counted from 1).
struct StepInputs {
  ir::Value* lr = nullptr;
  ir::Value* step = nullptr;
};

/// The output of update node `update` (an op declaring OpDef::update) that writes its
/// parameter input: the updated parameter.
ir::Value* updated_param(ir::Node* update);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// "SGD(momentum 0.9)", "AdamW(betas 0.9/0.999, eps 1e-08, weight decay 0.01)".
  virtual std::string describe() const = 0;
  /// The base learning rate (what a schedule scales).
  virtual double lr() const = 0;
  /// Appends one update node per parameter (phase Update, its op declaring OpDef::update).
  void apply(ir::Graph& g, const std::vector<ir::Value*>& params,
             const std::vector<ir::Value*>& grads, const StepInputs& in);
  /// The same, the state of params[i] named after names[i] ("<names[i]>.exp_avg") and shaped
  /// like params[i]: with ZeRO, params[i] is this rank's piece of parameter names[i].
  virtual void apply(ir::Graph& g, const std::vector<std::string>& names,
                     const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
                     const StepInputs& in) = 0;
  /// Creates the state of every parameter (zeros) before any graph is built, so a checkpoint
  /// can be loaded into it; apply() uses these tensors.
  void init_state(const NamedTensors& params);
  /// The same from the parameters' names and shapes (with ZeRO, of this rank's pieces).
  virtual void init_state(const std::vector<std::pair<std::string, Shape>>& params) = 0;
  /// The kinds of state kept per parameter, in the order they are created.
  virtual std::vector<std::string> state_kinds() const = 0;
  /// Replaces the state, returning the one before: a program compiled as another rank (the
  /// preflight's, with ZeRO) binds state of its own, then the rank's own is put back.
  NamedTensors exchange_state(NamedTensors s) { return std::exchange(state_, std::move(s)); }
  /// The state, named "<param>.<kind>" (PyTorch's kinds: momentum_buffer, exp_avg,
  /// exp_avg_sq), in parameter order. The tensors share the optimizer's storage: copying into
  /// them sets the state (checkpoint loading).
  NamedTensors state() const { return state_; }

 protected:
  /// The state tensor "<param>.<kind>", created as zeros of shape like when missing.
  const Tensor& state_for(const std::string& param, const std::string& kind, const Shape& like);
  NamedTensors state_;
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;      // 0: plain SGD, no state
  bool nesterov = false;      // needs momentum
  double weight_decay = 0.0;  // coupled, added to the gradient (PyTorch's SGD)
};

/// SGD with optional (Nesterov) momentum and weight decay, in PyTorch's form.
class Sgd final : public Optimizer {
 public:
  explicit Sgd(SgdOptions options);
  std::string describe() const override;
  double lr() const override { return options_.lr; }
  using Optimizer::apply;
  using Optimizer::init_state;
  void apply(ir::Graph& g, const std::vector<std::string>& names,
             const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
             const StepInputs& in) override;
  void init_state(const std::vector<std::pair<std::string, Shape>>& params) override;
  std::vector<std::string> state_kinds() const override;
  const SgdOptions& options() const { return options_; }

 private:
  SgdOptions options_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p *= 1 - lr * weight_decay
};

/// AdamW (torch.optim.AdamW): Adam's moments with bias correction, decoupled weight decay.
class AdamW final : public Optimizer {
 public:
  explicit AdamW(AdamWOptions options);
  std::string describe() const override;
  double lr() const override { return options_.lr; }
  using Optimizer::apply;
  using Optimizer::init_state;
  void apply(ir::Graph& g, const std::vector<std::string>& names,
             const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
             const StepInputs& in) override;
  void init_state(const std::vector<std::pair<std::string, Shape>>& params) override;
  std::vector<std::string> state_kinds() const override;
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
};

}  // namespace minidl::optim
