#include "minidl/core/threading.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "minidl/core/denormals.hpp"
#include "minidl/core/error.hpp"

namespace minidl {

void set_num_threads(int n) {
  MINIDL_CHECK(n >= 1, "thread count must be at least 1, got ", n);
  omp_set_num_threads(n);
  apply_denormals_to_threads();  // threads the larger pool adds get the same MXCSR
}

int ranks_on_host() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= 1 && n <= 1 << 20) return static_cast<int>(n);
  }
  return 1;
}

int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace minidl
