// Where a training step's time goes on one rank, from its kernels' profile: the forward's and
// the backward's compute, the updates, communication (sends, the copy of received messages,
// collectives and their waits) and idle time (a receive waiting for its message: with pipeline
// stages, the bubble). The bubble of a stage is its idle time over its step time (the sum of
// all of it), so that neither a send's copy nor a slow kernel counts as waiting.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "minidl/parallel/communicator.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl {

struct StageTimes {
  double forward = 0.0, backward = 0.0, update = 0.0, communication = 0.0, idle = 0.0;
  /// The step's time: everything above.
  double step() const { return forward + backward + update + communication + idle; }
  /// idle / step(), 0 without time.
  double bubble() const { return step() > 0.0 ? idle / step() : 0.0; }
  StageTimes operator-(const StageTimes& o) const {
    return {forward - o.forward, backward - o.backward, update - o.update,
            communication - o.communication, idle - o.idle};
  }
  StageTimes& operator+=(const StageTimes& o) {
    forward += o.forward;
    backward += o.backward;
    update += o.update;
    communication += o.communication;
    idle += o.idle;
    return *this;
  }
};

/// Adds the kernels' profiled seconds up by what they were spent on: a node's comm role or
/// communication phase makes it communication (less the idle part it noted), then its phase
/// (forward, backward, update).
StageTimes stage_times(std::span<const runtime::KernelProfile> profile);
/// Over every profile of the executables.
StageTimes stage_times(const std::vector<const runtime::Executable*>& executables);

/// Collective over comm, whose ranks are `stages` stages of equal size, stage-major (stage s:
/// ranks s * D ... s * D + D - 1): every stage's times, the mean over its ranks, on every rank.
std::vector<StageTimes> gather_stage_times(parallel::Communicator& comm, const StageTimes& mine,
                                           int stages);

/// The ideal bubble of a pipeline of P stages and M micro-batches: (P - 1) / (M + P - 1).
double ideal_bubble(int stages, int micro);

/// The report of an epoch: each stage's bubble beside the ideal, then each stage's time per
/// step by kind (`steps` steps in the times), one line each, indented by `indent`.
std::string format_stage_times(const std::vector<StageTimes>& stages, std::int64_t steps, int micro,
                               const std::string& indent);

}  // namespace minidl
