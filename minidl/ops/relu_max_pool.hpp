// A forward rewrite: ReLU commutes with max pooling, so max_pool2d(relu(x)) becomes
// relu(max_pool2d(x)) and the ReLU, its backward and its store run on the pooled elements only
// (a quarter of them under the CNNs' 2x2 pooling). Run on the forward graph before autograd, so
// the backward is derived from the rewritten forward; then ops::FuseBiasActivation folds the
// convolution's bias into the convolution (its output now read by the pooling) and the ReLU into
// the pooling (max_pool2d's `activation`).
#pragma once

#include "minidl/ir/pass.hpp"

namespace minidl::ops {

/// max_pool2d(relu(x)) -> relu(max_pool2d(x)), where the relu's output is read by the pooling
/// alone (and is not a graph output) and the pooling has no activation yet. Both new nodes take
/// the old ones' marks and names (Graph::take_name); they sit at the pooling's place. Why the
/// values and the gradients are the same is in relu_max_pool.cpp.
class ReluAfterMaxPool final : public ir::Pass {
 public:
  /// enabled false (--no-fuse): the graph is left alone.
  explicit ReluAfterMaxPool(bool enabled = true) : enabled_(enabled) {}
  std::string_view name() const override { return "relu-after-max-pool"; }
  std::vector<std::string> provides() const override { return {"relu-after-max-pool"}; }
  bool run(ir::Graph& g) override;

 private:
  bool enabled_;
};

}  // namespace minidl::ops
