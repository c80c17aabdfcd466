#include "minidl/parallel/communicator.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "minidl/core/clock.hpp"
#include "minidl/core/error.hpp"
#include "minidl/parallel/traffic.hpp"

namespace minidl::parallel {
namespace {

/// ranks_per_node as split_shared() takes it: an explicit value, else MINIDL_RANKS_PER_NODE,
/// else 0 (the real shared-memory split).
int resolve_ranks_per_node(int ranks_per_node) {
  MINIDL_CHECK(ranks_per_node >= 0,
               "ranks per node must be positive (or 0 for the real nodes), got ", ranks_per_node);
  if (ranks_per_node > 0) return ranks_per_node;
  const char* env = std::getenv("MINIDL_RANKS_PER_NODE");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  MINIDL_CHECK(*end == '\0' && v > 0 && v <= INT32_MAX,
               "MINIDL_RANKS_PER_NODE must be a positive integer (ranks per pretended node), got '",
               env, "'");
  return static_cast<int>(v);
}

/// Seconds after which a collective still waiting warns (no timeout): MINIDL_STALL_WARNING_SECONDS
/// when set (0: never), else 60. A bad value throws when `strict`, else counts as unset.
double stall_warning_seconds(bool strict) {
  // Simulated ranks never stall in real time: SimGrid reports a deadlock itself.
  if (simulated()) return 0.0;
  const char* env = std::getenv("MINIDL_STALL_WARNING_SECONDS");
  if (env == nullptr || *env == '\0') return 60.0;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  const bool good = *end == '\0' && v >= 0.0 && v <= 1e9;
  if (!good && !strict) return 60.0;
  MINIDL_CHECK(good,
               "MINIDL_STALL_WARNING_SECONDS must be a number of seconds >= 0 (0: no warning), "
               "got '",
               env, "'");
  return v;
}

std::atomic<std::int64_t>& traffic() {
  static std::atomic<std::int64_t> bytes{0};
  return bytes;
}

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator() : split_{this, this, true, 1} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string kind() const override { return "local"; }
  void allreduce_sum(float*, std::int64_t) override {}
  void allreduce_sum(double*, std::int64_t) override {}
  void allreduce_sum(std::int64_t*, std::int64_t) override {}
  void reduce_sum(float*, std::int64_t, int root) override { check_rank("reduce to", root); }
  void broadcast(void*, std::int64_t, int root) override { check_rank("broadcast from", root); }
  void allgather(const void* in, void* out, std::int64_t bytes) override {
    std::memcpy(out, in, static_cast<std::size_t>(bytes));
  }
  void allgatherv(const void* in, void* out, const std::vector<std::int64_t>& bytes) override {
    MINIDL_CHECK(bytes.size() == 1, "allgatherv: ", bytes.size(), " counts for 1 rank");
    std::memcpy(out, in, static_cast<std::size_t>(bytes[0]));
  }
  void reduce_scatter_sum(const float* data, float* out,
                          const std::vector<std::int64_t>& counts) override {
    MINIDL_CHECK(counts.size() == 1, "reduce_scatter: ", counts.size(), " counts for 1 rank");
    std::memcpy(out, data, static_cast<std::size_t>(counts[0]) * sizeof(float));
  }
  void barrier() override {}
  Request start_allreduce_sum(float*, std::int64_t) override {
    pending_.push_back(next_id_);
    return Request{next_id_++};
  }
  void wait(Request r) override {
    const auto n = std::erase(pending_, r.id);
    MINIDL_CHECK(n == 1, "wait for request ", r.id, ", which is not in flight");
  }
  int progress() override { return static_cast<int>(pending_.size()); }
  // A single process talks to itself: a send is kept until the matching recv takes it.
  void send(const void* data, std::int64_t bytes, int peer, int tag) override {
    check_rank("send to", peer);
    const auto* p = static_cast<const char*>(data);
    mailbox_[tag].emplace_back(p, p + bytes);
  }
  void recv(void* data, std::int64_t bytes, int peer, int tag) override {
    check_rank("recv from", peer);
    auto it = mailbox_.find(tag);
    MINIDL_CHECK(it != mailbox_.end() && !it->second.empty(), "recv from rank 0 with tag ", tag,
                 ": no message was sent (a single process cannot wait for one)");
    std::vector<char>& m = it->second.front();
    MINIDL_CHECK(static_cast<std::int64_t>(m.size()) == bytes, "recv from rank 0 with tag ", tag,
                 ": expected ", bytes, " bytes, the message has ", m.size());
    std::memcpy(data, m.data(), m.size());
    it->second.pop_front();
  }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<LocalCommunicator>();
  }
  const SharedSplit& split_shared(int ranks_per_node) override {
    resolve_ranks_per_node(ranks_per_node);  // a bad value fails here as under mpirun
    return split_;
  }
  void* shared_region(std::int64_t bytes) override {
    if (static_cast<std::int64_t>(region_.size()) < bytes)
      region_.resize(static_cast<std::size_t>(bytes));
    return region_.data();  // one process: nobody else reads it
  }
  void shared_sync() override {}
  std::string host() const override {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    return name;
  }
  [[noreturn]] void abort(int code) override { std::exit(code); }
  void set_timeout(double) override {}  // nothing to wait for

 private:
  static void check_rank(const char* what, int r) {
    MINIDL_CHECK(r == 0, what, " rank ", r, " in a single-process job");
  }
  SharedSplit split_;
  std::vector<std::int64_t> pending_;
  std::int64_t next_id_ = 0;
  std::map<int, std::deque<std::vector<char>>> mailbox_;
  std::vector<char> region_;
};

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  MINIDL_FAIL(what, " failed: ", std::string(text, len));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

int checked_count(std::int64_t n, const char* what) {
  MINIDL_CHECK(n >= 0 && n <= INT32_MAX, what, " of ", n, " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  /// The world: initialises MPI when nobody has.
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (!initialized) {
      // Collectives are called from the main thread only; OpenMP threads never call MPI.
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init");
      // Under SMPI every simulated rank is a copy of the program in one process, whose exit
      // handlers run after the simulation: a rank finalises when its main returns instead.
      if (!simulated()) {
        std::atexit([] {
          int finalized = 0;
          MPI_Finalized(&finalized);
          if (!finalized) MPI_Finalize();
        });
      }
    } else {
      MPI_Query_thread(&provided);
    }
    // SMPI provides MPI_THREAD_SINGLE: a simulated rank runs one thread (the app sees to it).
    const int needed = simulated() ? MPI_THREAD_SINGLE : MPI_THREAD_FUNNELED;
    MINIDL_CHECK(provided >= needed, "MPI provides ", thread_level_name(provided),
                 "; minidl needs at least MPI_THREAD_FUNNELED (MPI from the main thread while "
                 "OpenMP threads run)");
    // Compute between MPI calls is timed and injected by the simulator, so the simulated time
    // is the one that stands for the cluster's.
    if (simulated()) set_clock_source([] { return MPI_Wtime(); });
    MPI_Comm comm = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
    adopt(comm);
  }
  /// Takes ownership of comm (a split of another communicator).
  explicit MpiCommunicator(MPI_Comm comm) { adopt(comm); }
  /// Retires the arrival notes' requests, which MPI would otherwise complete into freed memory
  /// during MPI_Finalize (at exit, after this object is gone): the receives are cancelled (or
  /// completed, into inbox_ still alive), and sends not yet complete keep their buffers.
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Request& r : receives_) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    bool pending = false;
    for (Note& note : notes_) {
      int done = 0;
      MPI_Testall(static_cast<int>(note.requests.size()), note.requests.data(), &done,
                  MPI_STATUSES_IGNORE);
      if (done) continue;
      for (MPI_Request& r : note.requests)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      pending = true;
    }
    // A send freed while in flight still reads its buffer: those notes outlive this object.
    if (pending) new std::deque<Note>(std::move(notes_));  // NOLINT: deliberately leaked
    // Buffered sends: a completed schedule has received them all; after an error they may
    // still be in flight, and are freed the same way.
    bool sending = false;
    for (Sent& sent : sends_) {
      int done = 0;
      MPI_Test(&sent.request, &done, MPI_STATUS_IGNORE);
      if (done) continue;
      MPI_Request_free(&sent.request);
      sending = true;
    }
    if (sending) new std::deque<Sent>(std::move(sends_));  // NOLINT: deliberately leaked
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }
  void allreduce_sum(float* data, std::int64_t n) override { allreduce(data, n, MPI_FLOAT); }
  void allreduce_sum(double* data, std::int64_t n) override { allreduce(data, n, MPI_DOUBLE); }
  void allreduce_sum(std::int64_t* data, std::int64_t n) override {
    allreduce(data, n, MPI_INT64_T);
  }
  void reduce_sum(float* data, std::int64_t n, int root) override {
    check_rank("reduce to", root);
    const int count = checked_count(n, "reduce");
    const void* send = rank_ == root ? MPI_IN_PLACE : data;
    void* recv = rank_ == root ? data : nullptr;
    collective(
        "reduce", n * 4,
        [&] {
          check_mpi(MPI_Reduce(send, recv, count, MPI_FLOAT, MPI_SUM, root, comm_), "MPI_Reduce");
        },
        [&](MPI_Request* r) {
          check_mpi(MPI_Ireduce(send, recv, count, MPI_FLOAT, MPI_SUM, root, comm_, r),
                    "MPI_Ireduce");
        });
  }
  void broadcast(void* data, std::int64_t bytes, int root) override {
    check_rank("broadcast from", root);
    const int count = checked_count(bytes, "broadcast");
    collective(
        "broadcast", bytes,
        [&] { check_mpi(MPI_Bcast(data, count, MPI_BYTE, root, comm_), "MPI_Bcast"); },
        [&](MPI_Request* r) {
          check_mpi(MPI_Ibcast(data, count, MPI_BYTE, root, comm_, r), "MPI_Ibcast");
        });
  }
  void allgather(const void* in, void* out, std::int64_t bytes) override {
    const int count = checked_count(bytes, "allgather");
    collective(
        "allgather", bytes,
        [&] {
          check_mpi(MPI_Allgather(in, count, MPI_BYTE, out, count, MPI_BYTE, comm_),
                    "MPI_Allgather");
        },
        [&](MPI_Request* r) {
          check_mpi(MPI_Iallgather(in, count, MPI_BYTE, out, count, MPI_BYTE, comm_, r),
                    "MPI_Iallgather");
        });
  }
  void allgatherv(const void* in, void* out, const std::vector<std::int64_t>& bytes) override {
    MINIDL_CHECK(static_cast<int>(bytes.size()) == size_, "allgatherv: ", bytes.size(),
                 " counts for ", size_, " ranks");
    std::vector<int> counts, displs;
    std::int64_t total = 0;
    for (const std::int64_t b : bytes) {
      counts.push_back(checked_count(b, "allgatherv"));
      displs.push_back(checked_count(total, "allgatherv"));
      total += b;
    }
    const int mine = counts[static_cast<std::size_t>(rank_)];
    collective(
        "allgatherv", total,
        [&] {
          check_mpi(MPI_Allgatherv(in, mine, MPI_BYTE, out, counts.data(), displs.data(), MPI_BYTE,
                                   comm_),
                    "MPI_Allgatherv");
        },
        [&](MPI_Request* r) {
          check_mpi(MPI_Iallgatherv(in, mine, MPI_BYTE, out, counts.data(), displs.data(), MPI_BYTE,
                                    comm_, r),
                    "MPI_Iallgatherv");
        });
  }
  void reduce_scatter_sum(const float* data, float* out,
                          const std::vector<std::int64_t>& counts) override {
    MINIDL_CHECK(static_cast<int>(counts.size()) == size_, "reduce_scatter: ", counts.size(),
                 " counts for ", size_, " ranks");
    std::vector<int> c;
    std::int64_t total = 0;
    for (const std::int64_t n : counts) {
      c.push_back(checked_count(n, "reduce_scatter"));
      total += n;
    }
    checked_count(total, "reduce_scatter");
    collective(
        "reduce_scatter", total * 4,
        [&] {
          check_mpi(MPI_Reduce_scatter(data, out, c.data(), MPI_FLOAT, MPI_SUM, comm_),
                    "MPI_Reduce_scatter");
        },
        [&](MPI_Request* r) {
          check_mpi(MPI_Ireduce_scatter(data, out, c.data(), MPI_FLOAT, MPI_SUM, comm_, r),
                    "MPI_Ireduce_scatter");
        });
  }
  void barrier() override {
    collective(
        "barrier", 0, [&] { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); },
        [&](MPI_Request* r) { check_mpi(MPI_Ibarrier(comm_, r), "MPI_Ibarrier"); });
  }

  Request start_allreduce_sum(float* data, std::int64_t n) override {
    std::int64_t id = 0;
    while (id < static_cast<std::int64_t>(waiting_.size()) && waiting_[id]) ++id;
    if (id == static_cast<std::int64_t>(waiting_.size())) {
      requests_.push_back(MPI_REQUEST_NULL);
      waiting_.push_back(false);
      done_.resize(requests_.size());
    }
    announce();
    traffic().fetch_add(n * 4, std::memory_order_relaxed);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, checked_count(n, "allreduce"), MPI_FLOAT, MPI_SUM,
                             comm_, &requests_[id]),
              "MPI_Iallreduce");
    if (seq_of_.size() < requests_.size()) seq_of_.resize(requests_.size());
    seq_of_[id] = {seq_ - 1, n * 4};
    waiting_[id] = true;
    ++in_flight_;
    return Request{id};
  }
  void wait(Request r) override {
    MINIDL_CHECK(r.id >= 0 && r.id < static_cast<std::int64_t>(waiting_.size()) && waiting_[r.id],
                 "wait for request ", r.id, ", which is not in flight");
    // A request that progress() saw complete is already MPI_REQUEST_NULL: MPI_Wait returns.
    if (requests_[r.id] != MPI_REQUEST_NULL) {
      await(&requests_[r.id], "non-blocking allreduce", seq_of_[r.id].first, seq_of_[r.id].second);
      --in_flight_;
    }
    waiting_[r.id] = false;
  }
  int progress() override {
    if (in_flight_ == 0) return 0;
    int completed = 0;
    check_mpi(MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &completed,
                           done_.data(), MPI_STATUSES_IGNORE),
              "MPI_Testsome");
    if (completed != MPI_UNDEFINED) in_flight_ -= completed;
    return in_flight_;
  }

  // Sends are buffered: the message is copied and sent with MPI_Isend, so the sender goes on
  // while it is in flight (a blocking MPI_Send of a large message waits until the receiver
  // reaches its MPI_Recv: a pipeline stage would wait for its neighbour's compute). The buffers
  // of completed sends are reused.
  void send(const void* data, std::int64_t bytes, int peer, int tag) override {
    check_rank("send to", peer);
    const int count = checked_count(bytes, "send");
    retire_sends();
    std::vector<char> buffer;
    for (auto it = spare_.begin(); it != spare_.end(); ++it)
      if (it->capacity() >= static_cast<std::size_t>(bytes)) {
        buffer = std::move(*it);
        spare_.erase(it);
        break;
      }
    const auto* p = static_cast<const char*>(data);
    buffer.assign(p, p + bytes);
    Sent& sent = sends_.emplace_back(Sent{std::move(buffer), MPI_REQUEST_NULL});
    check_mpi(MPI_Isend(sent.buffer.data(), count, MPI_BYTE, peer, tag, comm_, &sent.request),
              "MPI_Isend");
  }
  void recv(void* data, std::int64_t bytes, int peer, int tag) override {
    check_rank("recv from", peer);
    MPI_Status status;
    check_mpi(MPI_Recv(data, checked_count(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &status),
              "MPI_Recv");
    retire_sends();
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    MINIDL_CHECK(got == bytes, "recv from rank ", peer, " with tag ", tag, ": expected ", bytes,
                 " bytes, the message has ", got);
  }

  void probe(int peer, int tag) override {
    check_rank("probe", peer);
    check_mpi(MPI_Probe(peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Probe");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    auto c = std::make_unique<MpiCommunicator>(sub);
    c->set_timeout(timeout_);
    return c;
  }
  const SharedSplit& split_shared(int ranks_per_node) override {
    const int k = resolve_ranks_per_node(ranks_per_node);
    auto& s = splits_[k];
    if (s.view.node != nullptr) return s.view;
    MPI_Comm node = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    if (k > 0) {
      check_mpi(MPI_Comm_split(comm_, rank_ / k, rank_, &node), "MPI_Comm_split");
    } else {
      check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                "MPI_Comm_split_type");
    }
    int node_rank = 0;
    MPI_Comm_rank(node, &node_rank);
    const bool leader = node_rank == 0;
    check_mpi(MPI_Comm_split(comm_, leader ? 0 : MPI_UNDEFINED, rank_, &leaders), "MPI_Comm_split");
    s.node = std::make_unique<MpiCommunicator>(node);
    s.node->set_timeout(timeout_);
    if (leader) {
      s.leaders = std::make_unique<MpiCommunicator>(leaders);
    } else {
      s.leaders = make_local_communicator();
    }
    s.leaders->set_timeout(timeout_);
    std::int64_t nodes = leader ? 1 : 0;
    allreduce_sum(&nodes, 1);
    s.view = SharedSplit{s.node.get(), s.leaders.get(), leader, static_cast<int>(nodes)};
    return s.view;
  }

  void* shared_region(std::int64_t bytes) override {
    // Two halves, each call the other one.
    bytes = (bytes + 63) / 64 * 64;
    flip_ = !flip_;
    if (window_ != MPI_WIN_NULL && bytes <= region_bytes_)
      return static_cast<char*>(region_) + (flip_ ? region_bytes_ : 0);
    if (window_ == MPI_WIN_NULL) {
      // Once: every rank must be on one node, or MPI could not map the others' memory.
      MPI_Comm node = MPI_COMM_NULL;
      check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                "MPI_Comm_split_type");
      int node_size = 0;
      MPI_Comm_size(node, &node_size);
      MPI_Comm_free(&node);
      MINIDL_CHECK(node_size == size_, "shared memory among ", size_, " ranks: only ", node_size,
                   " of them share this rank's node (", host(), ")");
    } else {
      MPI_Win_unlock_all(window_);
      MPI_Win_free(&window_);
    }
    // All of it on rank 0, so the region is contiguous; the others map it.
    void* base = nullptr;
    const MPI_Aint size = rank_ == 0 ? static_cast<MPI_Aint>(2 * bytes) : 0;
    check_mpi(MPI_Win_allocate_shared(size, 1, MPI_INFO_NULL, comm_, &base, &window_),
              "MPI_Win_allocate_shared");
    MPI_Aint got = 0;
    int unit = 0;
    check_mpi(MPI_Win_shared_query(window_, 0, &got, &unit, &region_), "MPI_Win_shared_query");
    MINIDL_CHECK(got >= 2 * bytes, "MPI_Win_shared_query: the shared region has ", got, " bytes, ",
                 2 * bytes, " were allocated");
    check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_), "MPI_Win_lock_all");
    region_bytes_ = bytes;
    return static_cast<char*>(region_) + (flip_ ? region_bytes_ : 0);
  }
  void shared_sync() override {
    // SMPI lacks MPI_Win_sync, and needs none: its simulated ranks take turns on one thread.
    const bool sync = window_ != MPI_WIN_NULL && !simulated();
    if (sync) MPI_Win_sync(window_);
    barrier();
    if (sync) MPI_Win_sync(window_);
  }
  std::string host() const override {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    return std::string(name, static_cast<std::size_t>(len));
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

  void set_timeout(double seconds) override {
    MINIDL_CHECK(seconds >= 0.0, "collective timeout must be >= 0 seconds, got ", seconds);
    MINIDL_CHECK(seconds == 0.0 || !simulated(),
                 "--collective-timeout does not apply to a simulated run (SimGrid SMPI): the "
                 "simulator ends a run that deadlocks, naming the blocked ranks");
    set_stall_warning(stall_warning_seconds(true));
    if (seconds > 0.0 && size_ > 1) post_arrival_receives();
    timeout_ = seconds;
    for (auto& [k, split] : splits_) {
      if (split.node) split.node->set_timeout(seconds);
      if (split.leaders) split.leaders->set_timeout(seconds);
    }
  }

  /// Without a timeout: a collective that has waited `seconds` (0: never) prints a warning on
  /// this rank naming it and the ranks that did not arrive, and again after every further
  /// `seconds`, and keeps waiting. From MINIDL_STALL_WARNING_SECONDS (default 60) when made;
  /// set_timeout reads it again, refusing a bad value.
  void set_stall_warning(double seconds) {
    if (seconds > 0.0 && size_ > 1) post_arrival_receives();
    stall_ = seconds;
  }

 private:
  void adopt(MPI_Comm comm) {
    comm_ = comm;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Arrival notes of the collective timeout travel apart from everything else.
    check_mpi(MPI_Comm_dup(comm_, &arrivals_), "MPI_Comm_dup");
    if (size_ > 1) gather_hosts();
    set_stall_warning(stall_warning_seconds(false));
  }

  /// Runs a collective: alone, blocking(); else start() posts its non-blocking form, awaited
  /// (against the timeout or stall period when watching()). Never the blocking form with
  /// several ranks: MPI does not match a blocking collective with a non-blocking one, so ranks
  /// that watch differently (another --collective-timeout) must still meet.
  /// Whether collectives are watched (a timeout or stall warnings): every rank then tells the
  /// others when it enters one, and waits for its non-blocking form.
  bool watching() const { return (timeout_ > 0.0 || stall_ > 0.0) && size_ > 1; }

  template <typename Blocking, typename Start>
  void collective(const char* what, std::int64_t bytes, Blocking&& blocking, Start&& start) {
    // Simulated ranks never watch, so all of them take the blocking forms (and SMPI 3.32's
    // non-blocking allreduce in place returned wrong sums on several ranks).
    if (size_ == 1 || simulated()) {
      if (simulated()) ++seq_;
      blocking();
      return;
    }
    traffic().fetch_add(bytes, std::memory_order_relaxed);
    announce();
    MPI_Request r = MPI_REQUEST_NULL;
    start(&r);
    await(&r, what, seq_ - 1, bytes);
  }

  /// Tells every other rank that this one entered its collective number seq_ (then counts it).
  void announce() {
    if (!watching()) {
      ++seq_;
      return;
    }
    // Sends that completed free their slots; a note is 8 bytes, so they complete at once.
    while (!notes_.empty()) {
      int done = 0;
      check_mpi(MPI_Testall(static_cast<int>(notes_.front().requests.size()),
                            notes_.front().requests.data(), &done, MPI_STATUSES_IGNORE),
                "MPI_Testall");
      if (!done) break;
      notes_.pop_front();
    }
    Note& note = notes_.emplace_back();
    note.seq = seq_++;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      note.requests.emplace_back();
      check_mpi(MPI_Isend(&note.seq, 1, MPI_INT64_T, peer, 0, arrivals_, &note.requests.back()),
                "MPI_Isend");
    }
  }

  /// Every rank's host and rank in the whole job, for the messages of the timeout and the stall
  /// warnings: gathered when the communicator is made (a collective every rank runs at the same
  /// point).
  void gather_hosts() {
    std::string mine = host();
    mine.resize(MPI_MAX_PROCESSOR_NAME, '\0');
    std::string all(static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME, '\0');
    check_mpi(MPI_Allgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                            MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm_),
              "MPI_Allgather");
    hosts_.clear();
    for (int r = 0; r < size_; ++r)
      hosts_.emplace_back(all.c_str() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    int mine_in_job = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &mine_in_job);
    job_ranks_.assign(static_cast<std::size_t>(size_), 0);
    check_mpi(MPI_Allgather(&mine_in_job, 1, MPI_INT, job_ranks_.data(), 1, MPI_INT, comm_),
              "MPI_Allgather");
  }

  /// Posts the receives of the other ranks' arrival notes (once).
  void post_arrival_receives() {
    if (!receives_.empty()) return;
    seen_.assign(static_cast<std::size_t>(size_), -1);
    inbox_.assign(static_cast<std::size_t>(size_), 0);
    receives_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      check_mpi(MPI_Irecv(&inbox_[peer], 1, MPI_INT64_T, peer, 0, arrivals_, &receives_[peer]),
                "MPI_Irecv");
    }
  }

  /// Takes in every arrival note that came, keeping the newest collective number per rank.
  void poll_arrivals() {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      for (;;) {
        int done = 0;
        check_mpi(MPI_Test(&receives_[peer], &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (!done) break;
        seen_[peer] = std::max(seen_[peer], inbox_[peer]);
        check_mpi(MPI_Irecv(&inbox_[peer], 1, MPI_INT64_T, peer, 0, arrivals_, &receives_[peer]),
                  "MPI_Irecv");
      }
    }
  }

  /// The ranks that arrived at collective number seq (this one among them) and those that did
  /// not, with the newest collective each of those entered and its host. Ranks are named as in
  /// the whole job (a node's or the leaders' communicator numbers its own).
  struct Arrivals {
    std::vector<int> arrived, missing;
    std::string last;  // "rank 1 last entered #6 on host a, rank 2 entered none on host b"
  };
  Arrivals arrivals(std::int64_t seq) {
    poll_arrivals();
    auto job_rank = [&](int r) { return job_ranks_.at(static_cast<std::size_t>(r)); };
    Arrivals a;
    a.arrived.push_back(job_rank(rank_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      if (seen_[peer] >= seq) {
        a.arrived.push_back(job_rank(peer));
      } else {
        a.missing.push_back(job_rank(peer));
        a.last += fmt::format("{}rank {} {} on host {}", a.last.empty() ? "" : ", ", job_rank(peer),
                              seen_[peer] < 0 ? std::string("entered none")
                                              : fmt::format("last entered #{}", seen_[peer]),
                              hosts_.at(static_cast<std::size_t>(peer)));
      }
    }
    std::sort(a.arrived.begin(), a.arrived.end());
    return a;
  }

  /// Waits for r, collective number seq: until the timeout, then throws naming who arrived;
  /// without one, for ever, warning after every stall period with who did not arrive.
  void await(MPI_Request* r, const char* what, std::int64_t seq, std::int64_t bytes) {
    if (!watching()) {
      check_mpi(MPI_Wait(r, MPI_STATUS_IGNORE), "MPI_Wait");
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const bool timed = timeout_ > 0.0;
    const double period = timed ? timeout_ : stall_;
    auto deadline = start + std::chrono::duration<double>(period);
    for (int spins = 0;; ++spins) {
      int done = 0;
      check_mpi(MPI_Test(r, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (spins % 64 == 0) {
        poll_arrivals();
        const auto now = std::chrono::steady_clock::now();
        if (now > deadline) {
          if (timed) break;
          const Arrivals a = arrivals(seq);
          fmt::print(
              stderr,
              "warning on rank {}: {} #{} ({} bytes over {} ranks) has waited {:.0f} s: "
              "rank(s) {} did not arrive ({}); still waiting (no --collective-timeout)\n",
              rank_, what, seq, bytes, size_, std::chrono::duration<double>(now - start).count(),
              a.missing.empty() ? std::string("none")
                                : fmt::format("{}", fmt::join(a.missing, ", ")),
              a.missing.empty() ? "every rank arrived: a peer may be stuck inside MPI" : a.last);
          std::fflush(stderr);
          deadline = now + std::chrono::duration<double>(period);
        }
      }
      // Spin first: most collectives complete within microseconds of the last arrival, and a
      // sleep's granularity would add to each. Only a long wait sleeps between tests.
      if (spins > 100000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    const Arrivals a = arrivals(seq);
    MINIDL_FAIL(what, " #", seq, " (", bytes, " bytes over ", size_,
                " ranks) did not complete within the collective timeout of ", timeout_,
                " s: rank(s) ", fmt::format("{}", fmt::join(a.arrived, ", ")), " arrived, rank(s) ",
                fmt::format("{}", fmt::join(a.missing, ", ")), " did not (", a.last,
                a.missing.empty() ? "every rank arrived: a peer may be stuck inside MPI" : "", ")");
  }
  void check_rank(const char* what, int r) const {
    MINIDL_CHECK(r >= 0 && r < size_, what, " rank ", r, " in a communicator of ", size_, " ranks");
  }
  void allreduce(void* data, std::int64_t n, MPI_Datatype t) {
    const int count = checked_count(n, "allreduce");
    int type_size = 0;
    MPI_Type_size(t, &type_size);
    collective(
        "allreduce", n * type_size,
        [&] {
          check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, count, t, MPI_SUM, comm_), "MPI_Allreduce");
        },
        [&](MPI_Request* r) {
          check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, count, t, MPI_SUM, comm_, r),
                    "MPI_Iallreduce");
        });
  }

  struct Split {
    std::unique_ptr<Communicator> node, leaders;
    SharedSplit view;
  };
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  // The collective timeout (set_timeout): collectives entered so far, the notes sent to the
  // other ranks (kept until their sends complete), and per rank the newest note received.
  double timeout_ = 0.0;
  double stall_ = 0.0;  // seconds before a stall warning (set_stall_warning); 0: none
  MPI_Comm arrivals_ = MPI_COMM_NULL;
  std::int64_t seq_ = 0;
  struct Note {
    std::int64_t seq = 0;
    std::vector<MPI_Request> requests;
  };
  std::deque<Note> notes_;
  // Buffered sends (send()) in flight, and the buffers of completed ones.
  struct Sent {
    std::vector<char> buffer;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::deque<Sent> sends_;
  std::vector<std::vector<char>> spare_;
  // Moves the buffers of completed sends to spare_.
  void retire_sends() {
    for (auto it = sends_.begin(); it != sends_.end();) {
      int done = 0;
      check_mpi(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) {
        ++it;
        continue;
      }
      spare_.push_back(std::move(it->buffer));
      it = sends_.erase(it);
    }
  }
  std::vector<std::int64_t> seen_, inbox_;
  std::vector<MPI_Request> receives_;
  // Per non-blocking request id: its collective number and size, for the timeout's message.
  std::vector<std::pair<std::int64_t, std::int64_t>> seq_of_;
  // Non-blocking operations: the request of id i is requests_[i]; waiting_[i] until wait(i).
  std::vector<MPI_Request> requests_;
  std::vector<bool> waiting_;
  std::vector<int> done_;  // MPI_Testsome's scratch
  int in_flight_ = 0;      // started and not seen complete
  std::map<int, Split> splits_;
  std::vector<std::string> hosts_;  // with several ranks: every rank's host
  std::vector<int> job_ranks_;      // and its rank in MPI_COMM_WORLD
  // shared_region(): the window, rank 0's base address in this process, the size of each of its
  // two halves, and which half the last call got.
  MPI_Win window_ = MPI_WIN_NULL;
  void* region_ = nullptr;
  std::int64_t region_bytes_ = 0;
  bool flip_ = false;
};

}  // namespace

bool simulated() {
#ifdef MINIDL_SIMGRID
  return true;
#else
  return false;
#endif
}

SimulatedRankScope::~SimulatedRankScope() {
  if (!simulated()) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

bool launched_by_mpi() {
  if (simulated()) return true;  // smpirun sets no launcher variables; the build runs under it
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

std::int64_t collective_bytes() { return traffic().load(std::memory_order_relaxed); }

void count_collective_bytes(std::int64_t bytes) {
  traffic().fetch_add(bytes, std::memory_order_relaxed);
}

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

namespace {
std::mutex& groups_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Communicator*>& groups() {
  static std::vector<Communicator*> g{&world()};
  return g;
}
}  // namespace

int register_group(Communicator* comm) {
  std::lock_guard lock(groups_mutex());
  auto& g = groups();
  for (std::size_t i = 0; i < g.size(); ++i)
    if (g[i] == comm) return static_cast<int>(i);
  g.push_back(comm);
  return static_cast<int>(g.size() - 1);
}

Communicator& group(int id) {
  std::lock_guard lock(groups_mutex());
  auto& g = groups();
  MINIDL_CHECK(id >= 0 && id < static_cast<int>(g.size()), "unknown communicator group ", id);
  return *g[id];
}

Communicator& world() {
  static std::unique_ptr<Communicator> comm = []() -> std::unique_ptr<Communicator> {
    if (launched_by_mpi()) return std::make_unique<MpiCommunicator>();
    return std::make_unique<LocalCommunicator>();
  }();
  return *comm;
}

}  // namespace minidl::parallel
