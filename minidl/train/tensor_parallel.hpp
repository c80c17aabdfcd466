// Tensor parallelism in a training step (parallel/tensor_parallel.hpp): compile_step splits
// the forward's Linear pairs over the shards before autograd, differentiates with respect to
// the pieces, lets the optimizer update the pieces with state shaped like them, and writes the
// gathered pieces back into the whole parameters. The optimizer's state of a split parameter
// is this shard's piece; checkpoints hold the whole tensors (whole_state, load_state_pieces).
#pragma once

#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/parallel/tensor_parallel.hpp"
#include "minidl/train/model.hpp"
#include "minidl/train/optimizer.hpp"

namespace minidl::train {

/// Appends the optimizer's updates of the pieces (and of the parameters not split), then the
/// gathers that write the pieces back. params and grads as for Optimizer::apply, with the
/// pieces in place of the split parameters (grads are the pieces' gradients). Before the first
/// graph reads it, the optimizer's state of a split parameter becomes its piece (taken from the
/// whole state, which a checkpoint may have filled).
void tensor_parallel_updates(ir::Graph& g, optim::Optimizer& optimizer,
                             const parallel::TensorParallelPlan& plan,
                             const parallel::TensorParallelOptions& o,
                             const std::vector<ir::Value*>& params,
                             const std::vector<ir::Value*>& grads, const optim::StepInputs& in);

/// The optimizer's state as whole tensors: every piece gathered over the shards (collective
/// over `shards`); state of parameters not split as it is.
NamedTensors whole_state(const NamedTensors& own, Model& model, parallel::Communicator& shards);
/// Copies into `own` (the optimizer's state, pieces or whole) this shard's part of `whole`.
void load_state_pieces(const NamedTensors& own, const NamedTensors& whole,
                       parallel::Communicator& shards);

}  // namespace minidl::train
