// What this process's collectives carried: a counter the communicators keep, read by the app for
// the metrics (bytes per step of the scaling study).
#pragma once

#include <cstdint>

namespace minidl::parallel {

/// The bytes of the buffers this process has handed to collectives with more than one rank
/// (each call counts its own buffer once: an allreduce of n floats 4n, an allgather the bytes
/// this rank contributes), since the process started. Not the bytes on the wire, which depend
/// on MPI's algorithms; the same measure for every layout.
std::int64_t collective_bytes();

/// Counts a hand-over that bypasses the communicator's collectives: the bytes a rank writes into
/// its node's shared memory for the others to read count as that rank's buffer.
void count_collective_bytes(std::int64_t bytes);

}  // namespace minidl::parallel
