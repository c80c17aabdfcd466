// Losses: what a model's output is scored against. A loss states the target it needs for a given
// output (shape and dtype), refusing outputs it cannot serve, and adds its nodes: the mean over
// the batch, and for classification the probabilities the loop reads back for accuracy.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::train {

struct LossNodes {
  ir::Value* loss = nullptr;         // [] mean over the batch
  ir::Value* predictions = nullptr;  // classification: probabilities [N, classes]; else null
};

/// The target a loss needs: its shape for the given output, and its dtype.
struct TargetSpec {
  Shape shape;
  DType dtype = DType::F32;
};

class Loss {
 public:
  virtual ~Loss() = default;
  /// The name --loss takes: "cross-entropy", "mse", "bce-with-logits".
  virtual std::string name() const = 0;
  /// Classification losses take class indices as targets; only they report accuracy.
  virtual bool classification() const { return false; }
  /// The target for a model output of this shape; throws minidl::Error naming the loss and the
  /// shape when it cannot score such an output.
  virtual TargetSpec target(const Shape& output) const = 0;
  virtual LossNodes build(ir::Value* output, ir::Value* target) const = 0;
};

/// Softmax cross-entropy of [N, classes] logits against i32 class indices [N], optionally with
/// label smoothing (torch.nn.CrossEntropyLoss(label_smoothing=e)).
class CrossEntropy final : public Loss {
 public:
  explicit CrossEntropy(double label_smoothing = 0.0);
  std::string name() const override { return "cross-entropy"; }
  bool classification() const override { return true; }
  TargetSpec target(const Shape& output) const override;
  LossNodes build(ir::Value* output, ir::Value* target) const override;

 private:
  double label_smoothing_;
};

/// Mean squared error against an f32 target of the output's shape (torch.nn.MSELoss()).
class MeanSquaredError final : public Loss {
 public:
  std::string name() const override { return "mse"; }
  TargetSpec target(const Shape& output) const override;
  LossNodes build(ir::Value* output, ir::Value* target) const override;
};

/// Binary cross-entropy of sigmoid(output) against f32 targets in [0, 1] of the output's shape
/// (torch.nn.BCEWithLogitsLoss()).
class BceWithLogits final : public Loss {
 public:
  std::string name() const override { return "bce-with-logits"; }
  TargetSpec target(const Shape& output) const override;
  LossNodes build(ir::Value* output, ir::Value* target) const override;
};

/// The names make_loss knows.
std::vector<std::string> loss_names();
/// The loss called name; fails naming the known ones.
std::unique_ptr<Loss> make_loss(std::string_view name, double label_smoothing = 0.0);

}  // namespace minidl::train
