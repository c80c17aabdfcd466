// Preflight: before any other collective, every rank checks that all ranks will run the same
// thing, and tells the others when it cannot start at all. A mismatch (another model, other
// settings, another binary) would otherwise surface as a hang in a collective, or as ranks that
// train apart in silence; a rank that failed alone (a flag error, a missing file) would leave
// the others waiting. Here every rank fails at once, with the same message.
#pragma once

#include <string>

#include "minidl/core/error.hpp"
#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"

namespace minidl::parallel {

/// Thrown by preflight() on every rank of the communicator at once, with the same message: no
/// rank is left waiting, so the caller may report it on one rank and end normally.
class PreflightError : public Error {
 public:
  PreflightError(const std::string& what, int exit_code) : Error(what), exit_code_(exit_code) {}
  /// The exit status the failing rank asked for (2 for a flag error), else 1.
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

/// One line per node: op, name, the shapes of parameters and of reduced values, in order; for
/// communication nodes also their attributes and the nodes they read, so the data-parallel
/// schedule (strategy, buckets and their members, placement) is part of it. Batch dimensions of
/// activations are left out (ranks may hold shares that differ by one sample).
std::string fingerprint(const ir::Graph& g);

/// Compares `description` (a fingerprint plus anything else that must agree, one item per line)
/// across the ranks of comm; `error`, when not empty, says that this rank cannot start (then
/// its description is not compared), and exit_code is the status it asks for. Throws
/// PreflightError on every rank when any rank failed ("rank(s) 1 of 2 could not start: <the
/// lowest such rank's error>") or differs ("the training set-up of rank(s) 1 differs from rank
/// 0's; first difference (rank 1) at item 3: rank 0 has '...', rank 1 has '...'"). With one
/// rank: returns, or throws PreflightError with error itself.
void preflight(Communicator& comm, const std::string& description, const std::string& error = {},
               int exit_code = 1);

}  // namespace minidl::parallel
