// The data-parallel pass: every rank runs the same training graph on its share of the global
// batch; the pass inserts, right after each parameter gradient is final, an allreduce that sums
// the ranks' gradients weighted by their share, so every optimizer update sees the gradient of
// the global batch and all ranks keep identical parameters.
#pragma once

#include "minidl/ir/pass.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

class DataParallel final : public ir::Pass {
 public:
  /// share: this rank's fraction of the global batch (local samples / global samples).
  DataParallel(Communicator& comm, double share) : group_(register_group(&comm)), share_(share) {}
  std::string_view name() const override { return "data-parallel"; }
  /// Reduces the input called "grad" of every optimizer update node (phase=update).
  bool run(ir::Graph& g) override;

 private:
  int group_;
  double share_;
};

}  // namespace minidl::parallel
