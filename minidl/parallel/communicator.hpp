// Communicators: how ranks talk. MpiCommunicator runs over OpenMPI when the process was started
// by mpirun; LocalCommunicator is the single-process stand-in, so every binary also runs alone.
// MPI is called from the main thread only (OpenMP threads never call it): MPI_THREAD_FUNNELED.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace minidl::parallel {

class Communicator {
 public:
  /// A non-blocking operation in flight, issued by this communicator. Plain data (an id into the
  /// communicator's table of pending operations), so one kernel can hand it to another through a
  /// tensor. wait() completes it; every request must be waited for exactly once.
  struct Request {
    std::int64_t id = -1;
  };

  /// The node-local communicator and the leaders' communicator (local rank 0 of every node).
  struct SharedSplit {
    Communicator* node = nullptr;
    /// On a leader: the leaders, in node order. On any other rank: a single-process communicator,
    /// so a collective among the leaders is a no-op there (the node broadcast that follows
    /// overwrites whatever it holds).
    Communicator* leaders = nullptr;
    bool leader = false;
    int nodes = 1;  // number of nodes (leaders) in the job
  };

  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi" or "local".
  virtual std::string kind() const = 0;
  /// In place: every rank ends with the element-wise sum over ranks.
  virtual void allreduce_sum(float* data, std::int64_t n) = 0;
  virtual void allreduce_sum(double* data, std::int64_t n) = 0;
  virtual void allreduce_sum(std::int64_t* data, std::int64_t n) = 0;
  /// In place: root ends with the element-wise sum over ranks; the others keep their data.
  virtual void reduce_sum(float* data, std::int64_t n, int root) = 0;
  /// Copies root's bytes to every rank.
  virtual void broadcast(void* data, std::int64_t bytes, int root) = 0;
  /// Every rank contributes `bytes` bytes; out gets size() * bytes, rank order.
  virtual void allgather(const void* in, void* out, std::int64_t bytes) = 0;
  /// Rank r contributes bytes[r] bytes (its own from in); out gets them all, in rank order.
  virtual void allgatherv(const void* in, void* out, const std::vector<std::int64_t>& bytes) = 0;
  /// The element-wise sum over ranks of data (sum(counts) floats), cut in rank order: rank r's
  /// out gets the counts[r] floats of its part (MPI_Reduce_scatter).
  virtual void reduce_scatter_sum(const float* data, float* out,
                                  const std::vector<std::int64_t>& counts) = 0;
  virtual void barrier() = 0;

  /// Starts an in-place allreduce (sum) of data (MPI_Iallreduce). data must stay untouched until
  /// wait() returns.
  virtual Request start_allreduce_sum(float* data, std::int64_t n) = 0;
  /// Blocks until r is complete (MPI_Wait) and retires it.
  virtual void wait(Request r) = 0;
  /// Lets pending non-blocking operations advance: OpenMPI moves them on only inside MPI calls.
  /// Cheap when nothing is pending. Returns how many are still in flight.
  virtual int progress() = 0;

  /// Point to point, blocking. Messages between a pair of ranks with the same tag arrive in order.
  virtual void send(const void* data, std::int64_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, std::int64_t bytes, int peer, int tag) = 0;
  /// Blocks until a message from peer with tag has arrived (MPI_Probe), without receiving it:
  /// the time a receiver waits for its sender, apart from the time the message takes to copy.
  /// A single process has its messages already (a recv without one fails there).
  virtual void probe(int peer, int tag) {
    (void)peer;
    (void)tag;
  }

  /// The node-local communicator (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) and the leaders'.
  /// ranks_per_node > 0 pretends nodes of that many consecutive ranks (tests on one machine);
  /// 0 takes it from the environment variable MINIDL_RANKS_PER_NODE when set, else the real
  /// shared-memory split. Collective on the first call for a given value; the result is kept by
  /// this communicator and later calls return it.
  virtual const SharedSplit& split_shared(int ranks_per_node = 0) = 0;

  /// The ranks of this communicator with the same color, ordered by key (MPI_Comm_split):
  /// collective over all of its ranks. The new communicator takes this one's timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  /// Memory every rank of this communicator addresses directly, for ranks that share a node
  /// (MPI_Win_allocate_shared): `bytes` bytes, the same region on every rank. One window per
  /// communicator, of two halves: each call returns the other half, so what a call writes never
  /// touches what the previous call's readers may still read. Reused by every call and grown
  /// (collectively: every rank asks for the same size at the same point) when a call needs
  /// more; earlier pointers are then invalid. Fails when the ranks do not share memory.
  virtual void* shared_region(std::int64_t bytes) = 0;
  /// A barrier that also orders the shared region: what any rank wrote to it before is seen by
  /// every rank after.
  virtual void shared_sync() = 0;

  /// The host this rank runs on (MPI_Get_processor_name), for messages.
  virtual std::string host() const = 0;

  /// Ends the whole job with a non-zero exit (after one rank's error, so no rank waits forever).
  [[noreturn]] virtual void abort(int code) = 0;

  /// Seconds a collective (or the wait for a non-blocking one) may take before it throws
  /// minidl::Error naming it and which ranks reached it (0: wait forever, the default). Without
  /// a timeout, a collective that has waited MINIDL_STALL_WARNING_SECONDS (default 60; 0: never)
  /// prints a warning on stderr naming it and the ranks that did not arrive, again after every
  /// further period, and keeps waiting (as Horovod's stall inspector). For both every rank tells
  /// the others each time it enters a collective (a few bytes per peer), so the message can say
  /// who is missing. Applies to the communicators split from this one too. Throws on a bad
  /// MINIDL_STALL_WARNING_SECONDS.
  virtual void set_timeout(double seconds) = 0;
};

/// The communicator of all processes of this job: MPI when started by mpirun (MPI is
/// initialised on first use and finalised at exit), else local. The same object every call.
Communicator& world();

/// True when this process was started by an MPI launcher (always in a simulated build).
bool launched_by_mpi();

/// True in a build against SimGrid's SMPI (MINIDL_SIMGRID): the ranks are simulated processes
/// of one real process, each with one thread (SMPI provides MPI_THREAD_SINGLE), and every time
/// minidl reports (minidl::Clock) is the simulated time.
bool simulated();

/// In a simulated build, finalises MPI when it goes out of scope: a simulated rank must before
/// its main returns, since the process's exit handlers run after the simulation. Nothing in a
/// real build (MPI is finalised at exit).
class SimulatedRankScope {
 public:
  SimulatedRankScope() = default;
  SimulatedRankScope(const SimulatedRankScope&) = delete;
  SimulatedRankScope& operator=(const SimulatedRankScope&) = delete;
  ~SimulatedRankScope();
};

/// A single-process communicator (a reference run inside a multi-rank job, tests).
std::unique_ptr<Communicator> make_local_communicator();

/// Collective ops name their communicator by a group id (an attribute), since attributes hold
/// no pointers. world() is group 0; register_group adds another and returns its id. comm must
/// outlive every executable compiled from a graph that names its id.
int register_group(Communicator* comm);
Communicator& group(int id);

}  // namespace minidl::parallel
