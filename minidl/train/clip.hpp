// Global-norm gradient clipping as a pass, after the gradient reduction: the squared norms of the
// gradients the updates read (each once, in update order) are summed, clip_coef turns the total
// into min(1, max_norm / (norm + 1e-6)), and every update takes that factor as its grad_scale
// input. The gradients are reduced already, so every rank computes the same norm; in
// deterministic mode they have the same bits for any layout, and so does the norm (fixed chunks,
// fixed order).
#pragma once

#include "minidl/ir/pass.hpp"

namespace minidl::train {

class ClipGradNorm final : public ir::Pass {
 public:
  /// max_norm <= 0: the pass does nothing (and still provides "gradients-clipped").
  /// total: the gradients' summed squared norms, already in the graph (ZeRO computes it from
  /// the ranks' shards); null: the pass sums the squared norms of the gradients the updates read.
  explicit ClipGradNorm(double max_norm, ir::Value* total = nullptr)
      : max_norm_(max_norm), given_total_(total) {}
  std::string_view name() const override { return "clip-grad-norm"; }
  std::vector<std::string> needs() const override { return {"gradients-reduced"}; }
  std::vector<std::string> provides() const override { return {"gradients-clipped"}; }
  bool run(ir::Graph& g) override;
  /// After run(): the total norm before clipping ([] f32, a graph output), or null.
  ir::Value* norm() const { return norm_; }

 private:
  double max_norm_;
  ir::Value* given_total_;
  ir::Value* norm_ = nullptr;
};

}  // namespace minidl::train
