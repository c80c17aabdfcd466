// Loading a checkpoint (minidl/io/checkpoint.hpp) once for all ranks of a job.
#pragma once

#include <string>

#include "minidl/io/checkpoint.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::checkpoint {

/// resolve() and load() on rank 0, then the tensors and the metadata are broadcast to every
/// rank: a collective. An error on rank 0 leaves the others waiting; the caller ends the job.
Loaded load_shared(parallel::Communicator& comm, const std::string& path, const Tensors& into);

}  // namespace minidl::checkpoint
