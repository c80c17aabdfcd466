// Idle time inside a kernel: a kernel that waits for another process (a pipeline stage's
// receive, waiting for its neighbour to compute what it sends) tells the runtime how long, so
// that the profile and the trace show that wait (the pipeline's bubble) apart from the kernel's
// own work (copying the message). The runtime asks for it only when it measures kernels.
#pragma once

namespace minidl {

/// Whether the kernel running on this thread should measure its waits (the runtime sets it
/// around each kernel call it times; off, a kernel should not spend time measuring).
bool idle_wanted();
void set_idle_wanted(bool on);

/// Called by a kernel, on its thread: it spent `seconds` at its start waiting for another
/// process, with nothing to compute.
void note_idle(double seconds);

/// The seconds noted on this thread since the last call, which it resets (the runtime, after
/// each kernel it times).
double take_idle();

}  // namespace minidl
