// Tensor parallelism in a training run (parallel/tensor_parallel.hpp): before training, each
// rank stores only its parts of the parameters the rewrite splits (shard_split_parameters,
// train::ParameterShard); compile_step then splits the forward's Linear pairs over the shards
// before autograd, so the parts are differentiated and updated, and the optimizer's state,
// made for model.parameters(), is shaped like them. Saving and checkpoints hold whole tensors:
// gather_parameters and whole_state gather the parts, load_parameters and load_state_pieces
// take each rank's part of whole tensors (at any shard count).
#pragma once

#include <vector>

#include "minidl/core/shape.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/train/model.hpp"

namespace minidl::train {

/// Stores each parameter the tensor-parallel rewrite splits (found on a graph of model's
/// forward for one sample of shape `sample`) as this rank's part over `shards`, taken from its
/// current whole value (the same on every shard: initialise or load the model first). Throws
/// as parallel::split_matmul_pairs does for a model it cannot split. Communicates nothing.
void shard_split_parameters(Model& model, const Shape& sample, parallel::Communicator& shards);

/// The model's parameters by full name, whole: the parts of a sharded one gathered over its
/// group (a collective of every rank of the group), the others as they are (sharing storage).
NamedTensors gather_parameters(Model& model);
/// Copies whole tensors (by full name; every parameter of model must be there) into the
/// model's parameters, a sharded one taking its part. Skips a tensor that is the parameter's
/// own storage.
void load_parameters(Model& model, const NamedTensors& whole);
/// Stores every sharded parameter whole again (gathered: a collective), so that graphs read it
/// without communicating (predictions on one rank).
void unshard_parameters(Model& model);

/// The optimizer's state as whole tensors: the state of a sharded parameter gathered over the
/// shards (collective over `shards`); the rest as it is.
NamedTensors whole_state(const NamedTensors& own, Model& model, parallel::Communicator& shards);
/// Copies into `own` (the optimizer's state, pieces or whole) this shard's part of `whole`.
void load_state_pieces(const NamedTensors& own, const NamedTensors& whole,
                       parallel::Communicator& shards);

}  // namespace minidl::train
