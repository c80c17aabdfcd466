// The measured time of a model's forward nodes, for the pipeline's automatic cut
// (--stage-balance time): a few profiled training steps of the whole model in one process, on a
// micro-batch, each node's time with its backward's, and the same table on every rank.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "minidl/train/step.hpp"

namespace minidl::train {

/// Per forward node name: the seconds per step of that node and of the nodes named after it
/// (its backward, "<name>.bwd..."; a fused node "<name>+bias+relu"), summed over the profile of
/// a step; a parameter's update under the parameter's name. Communication is left out.
using NodeSeconds = std::map<std::string, double>;

/// Attributes each profiled kernel of `runs` steps to the forward node it is named after: the
/// name up to a '+' (fusion) and before a ".bwd" component (backward), "fc1.matmul.bwd.1" and
/// "fc1.matmul+bias+relu" both to "fc1.matmul".
NodeSeconds attribute_to_forward(const std::vector<runtime::KernelProfile>& profile, int runs);

/// Rank 0 runs `steps` profiled training steps of the whole model in one process on `micro` samples
/// of zeros (one thread per micro-batch, as a stage runs it), and takes each kernel's least
/// time over the steps after the first, and restores every parameter,
/// buffer and optimizer state tensor afterwards, so that training is not changed by a bit
/// (neither the data order nor a random stream is touched), and broadcasts the table over `comm`
/// (a collective: every rank calls it at the same point), so every rank cuts alike.
NodeSeconds profile_forward(Model& model, const Loss& loss, optim::Optimizer& optimizer,
                            const Shape& sample, std::int64_t micro, const StepOptions& options,
                            parallel::Communicator& comm, int steps = 4);

}  // namespace minidl::train
