// Preflight: before the first step, every rank checks that all ranks will run the same thing.
// A mismatch (another model, other data, another batch size) would otherwise surface as a hang
// in a collective; here every rank fails at once with the first difference.
#pragma once

#include <string>

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

/// One line per node: op, name, the shapes of parameters and of reduced values, in order; for
/// communication nodes also their attributes and the nodes they read, so the data-parallel
/// schedule (strategy, buckets and their members, placement) is part of it. Batch dimensions of
/// activations are left out (ranks may hold shares that differ by one sample).
std::string fingerprint(const ir::Graph& g);

/// Compares `description` (a fingerprint plus anything else that must agree, one item per line)
/// across the ranks of comm. Throws minidl::Error on every rank when any rank differs, naming
/// the ranks and, on those ranks, the first line that differs from rank 0's.
void preflight(Communicator& comm, const std::string& description);

}  // namespace minidl::parallel
