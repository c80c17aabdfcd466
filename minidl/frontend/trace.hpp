// Chrome trace output (--trace FILE.json): the kernel calls of every rank on one timeline, in
// the Trace Event Format that Perfetto and chrome://tracing open. Each rank is a process ("rank
// r"), each thread a track; an event's category says what the time was spent on. A receive
// that waited for its message shows the wait as a span of its own, "bubble" (category idle),
// followed by the receive's own span.
#pragma once

#include <string>
#include <vector>

#include "minidl/parallel/communicator.hpp"

namespace minidl {

struct TraceSpan {
  std::string name;      // the node; "bubble" for a wait in a receive
  std::string category;  // compute, communication, wait, update, or idle (a bubble)
  std::string op, kernel;
  int thread = 0;
  double begin_us = 0.0;  // runtime::trace_clock_us(): one clock for all processes of a machine
  double duration_us = 0.0;
  double flops = 0.0;     // 0: not counted
  std::string waited_in;  // a bubble: the receive that waited (its node)
};

/// Collective: every rank passes its spans; rank 0 writes one JSON file for the whole job
/// (a temporary file renamed into place, so no half-written trace is left behind). Times are
/// shifted so that the job's first event starts at 0. Returns the number of events written on
/// rank 0, 0 elsewhere.
std::size_t write_chrome_trace(const std::string& path, parallel::Communicator& comm,
                               const std::vector<TraceSpan>& spans);

}  // namespace minidl
