// ZeRO's part of a training graph, for both programs that update: a step's (no accumulation)
// and the apply program (gradient accumulation, its inputs the micro-steps' summed gradients).
// The gradients are reduced as one flat bucket to this rank's shard (parallel/zero.hpp), the
// optimizer updates the pieces of the parameters in it with state for them only, and the
// all-gather writes every parameter.
#pragma once

#include <cstdint>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/train/model.hpp"
#include "minidl/train/optimizer.hpp"

namespace minidl::train {

struct ZeroUpdate {
  int stage = 1;                           // 1: optimizer state sharded; 2: gradients too
  int rank = 0;                            // the rank the graph is built for
  parallel::Communicator* comm = nullptr;  // the data-parallel ranks
  std::int64_t tree_leaves = 0;            // deterministic mode: the tree's micro-shards
  bool reduced = false;                    // the gradients are summed over the ranks already
  bool clip = false;                       // return the squared norm for global-norm clipping
};

/// Adds ZeRO's reduction, sharded update and all-gather to g: grads[i] is the gradient of the
/// parameter node params[i] (params in update order). Returns the gradients' squared global
/// norm computed from the shards (the same bits as the replicated run's), for ClipGradNorm,
/// when z.clip; otherwise nullptr.
ir::Value* zero_update(ir::Graph& g, Model& model, optim::Optimizer& optimizer,
                       const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
                       const optim::StepInputs& in, const ZeroUpdate& z);

}  // namespace minidl::train
