// Communicators: how ranks talk. MpiCommunicator runs over OpenMPI when the process was started
// by mpirun; LocalCommunicator is the single-process stand-in, so every binary also runs alone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace minidl::parallel {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi" or "local".
  virtual std::string kind() const = 0;
  /// In place: every rank ends with the element-wise sum over ranks.
  virtual void allreduce_sum(float* data, std::int64_t n) = 0;
  virtual void allreduce_sum(double* data, std::int64_t n) = 0;
  virtual void allreduce_sum(std::int64_t* data, std::int64_t n) = 0;
  /// Copies root's bytes to every rank.
  virtual void broadcast(void* data, std::int64_t bytes, int root) = 0;
  /// Every rank contributes `bytes` bytes; out gets size() * bytes, rank order.
  virtual void allgather(const void* in, void* out, std::int64_t bytes) = 0;
  virtual void barrier() = 0;
  /// Ends the whole job with a non-zero exit (after one rank's error, so no rank waits forever).
  [[noreturn]] virtual void abort(int code) = 0;
};

/// The communicator of all processes of this job: MPI when started by mpirun (MPI is
/// initialised on first use and finalised at exit), else local. The same object every call.
Communicator& world();

/// True when this process was started by an MPI launcher.
bool launched_by_mpi();

/// A single-process communicator (a reference run inside a multi-rank job, tests).
std::unique_ptr<Communicator> make_local_communicator();

/// Collective ops name their communicator by a group id (an attribute), since attributes hold
/// no pointers. world() is group 0; register_group adds another and returns its id.
int register_group(Communicator* comm);
Communicator& group(int id);

}  // namespace minidl::parallel
