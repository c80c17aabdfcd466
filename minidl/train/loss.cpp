#include "minidl/train/loss.hpp"

#include "minidl/ops/ops.hpp"

namespace minidl::train {

CrossEntropy::CrossEntropy(double label_smoothing) : label_smoothing_(label_smoothing) {
  MINIDL_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
               "label smoothing must lie in [0, 1], got ", label_smoothing);
}

TargetSpec CrossEntropy::target(const Shape& output) const {
  MINIDL_CHECK(output.rank() == 2 && output[1] >= 2,
               "loss cross-entropy needs the model's output "
               "as logits [N, classes] with at least 2 classes, got ",
               output);
  return {Shape{output[0]}, DType::I32};
}

LossNodes CrossEntropy::build(ir::Value* output, ir::Value* target) const {
  ir::Node* n = ops::apply_node("softmax_cross_entropy", {output, target},
                                {{"label_smoothing", label_smoothing_}});
  return {n->output(0), n->output(1)};
}

TargetSpec MeanSquaredError::target(const Shape& output) const { return {output, DType::F32}; }

LossNodes MeanSquaredError::build(ir::Value* output, ir::Value* target) const {
  return {ops::apply("mse_loss", {output, target}), nullptr};
}

TargetSpec BceWithLogits::target(const Shape& output) const { return {output, DType::F32}; }

LossNodes BceWithLogits::build(ir::Value* output, ir::Value* target) const {
  return {ops::apply("bce_with_logits", {output, target}), nullptr};
}

std::vector<std::string> loss_names() { return {"cross-entropy", "mse", "bce-with-logits"}; }

std::unique_ptr<Loss> make_loss(std::string_view name, double label_smoothing) {
  if (name == "cross-entropy") return std::make_unique<CrossEntropy>(label_smoothing);
  MINIDL_CHECK(label_smoothing == 0.0, "label smoothing applies to cross-entropy only, not to '",
               name, "'");
  if (name == "mse") return std::make_unique<MeanSquaredError>();
  if (name == "bce-with-logits") return std::make_unique<BceWithLogits>();
  MINIDL_FAIL("unknown loss '", name,
              "' (known: ", fmt::format("{}", fmt::join(loss_names(), ", ")), ")");
}

}  // namespace minidl::train
