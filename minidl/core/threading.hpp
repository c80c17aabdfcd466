// OpenMP helpers: thread counts and a parallel loop that stays serial for small work.
#pragma once

#include <omp.h>

#include <cstdint>

namespace minidl {

/// Threads an OpenMP parallel region started now would use.
inline int max_threads() { return omp_get_max_threads(); }
/// Sets the threads for later parallel regions (n >= 1).
void set_num_threads(int n);
/// Index of the calling thread within its parallel region.
inline int thread_id() { return omp_get_thread_num(); }
/// The CPUs this process may run on (its affinity mask: 1 for an mpirun rank bound to a core).
int allowed_cpus();
/// Ranks of this job on this host, from the MPI launcher's environment; 1 when unknown.
int ranks_on_host();

/// Calls fn(begin, end) over [0, n) split into contiguous chunks, one per thread; runs serially
/// when n * cost_per_item is below a threshold where a fork would cost more than it saves.
template <typename Fn>
void parallel_for(std::int64_t n, std::int64_t cost_per_item, Fn&& fn) {
  constexpr std::int64_t kMinParallelWork = 32768;
  if (n <= 0) return;
  if (n * cost_per_item < kMinParallelWork || max_threads() == 1 || omp_in_parallel()) {
    fn(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const std::int64_t nt = omp_get_num_threads();
    const std::int64_t t = omp_get_thread_num();
    const std::int64_t begin = n * t / nt;
    const std::int64_t end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
}

}  // namespace minidl
