#include "minidl/parallel/communicator.hpp"

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "minidl/core/error.hpp"

namespace minidl::parallel {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string kind() const override { return "local"; }
  void allreduce_sum(float*, std::int64_t) override {}
  void allreduce_sum(double*, std::int64_t) override {}
  void allreduce_sum(std::int64_t*, std::int64_t) override {}
  void broadcast(void*, std::int64_t, int root) override {
    MINIDL_CHECK(root == 0, "broadcast from rank ", root, " in a single-process job");
  }
  void allgather(const void* in, void* out, std::int64_t bytes) override {
    std::memcpy(out, in, static_cast<std::size_t>(bytes));
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  MINIDL_FAIL(what, " failed: ", std::string(text, len));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Collectives are called from the main thread only; OpenMP threads never call MPI.
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init");
      std::atexit([] {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
      });
    }
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }
  void allreduce_sum(float* data, std::int64_t n) override { reduce(data, n, MPI_FLOAT); }
  void allreduce_sum(double* data, std::int64_t n) override { reduce(data, n, MPI_DOUBLE); }
  void allreduce_sum(std::int64_t* data, std::int64_t n) override { reduce(data, n, MPI_INT64_T); }
  void broadcast(void* data, std::int64_t bytes, int root) override {
    check_mpi(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
  }
  void allgather(const void* in, void* out, std::int64_t bytes) override {
    check_mpi(MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes),
                            MPI_BYTE, comm_),
              "MPI_Allgather");
  }
  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  void reduce(void* data, std::int64_t n, MPI_Datatype t) {
    MINIDL_CHECK(n <= INT32_MAX, "allreduce of ", n, " elements exceeds MPI's int count");
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), t, MPI_SUM, comm_),
              "MPI_Allreduce");
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
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
