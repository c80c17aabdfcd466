#include "minidl/app/simulated.hpp"

#include <fmt/format.h>

#include <memory>

#include "minidl/core/error.hpp"
#include "minidl/parallel/communicator.hpp"

#ifdef MINIDL_SIMGRID
#include "minidl/app/simulated_store.hpp"
#endif

namespace minidl {

void apply_simulated_rules(AppConfig& c) {
  if (!parallel::simulated()) return;
  MINIDL_CHECK(c.threads == 0 || c.threads == 1, "--threads ", c.threads,
               ": a simulated run (SimGrid SMPI, MPI_THREAD_SINGLE) has one thread per rank; "
               "use --threads 1 and more ranks per node");
  MINIDL_CHECK(c.collective_timeout == 0.0,
               "--collective-timeout does not apply to a simulated run (SimGrid SMPI): the "
               "simulator ends a run that deadlocks itself");
  // SMPI 3.32's non-blocking allreduce in place returned wrong sums on several ranks.
  MINIDL_CHECK(!c.overlap,
               "--overlap does not apply to a simulated run (SimGrid SMPI): its non-blocking "
               "allreduce is not reliable there; simulate without it");
  c.threads = 1;
  // The ranks share one real thread, which the simulator times between MPI calls: a prefetch
  // thread would do its work outside both.
  c.no_prefetch = true;
}

DatasetSplits simulated_shared_data(const AppConfig& c, const std::string& dir,
                                    const std::function<DatasetSplits()>& make) {
#ifdef MINIDL_SIMGRID
  // Everything make() reads from the flags.
  const std::string key =
      fmt::format("data {} {} train {} test {} upscale {} normalize {}", c.dataset, dir,
                  c.train_limit, c.test_limit, c.upscale, c.normalize);
  if (std::shared_ptr<void> kept = simulated_store_get(key))
    return *static_cast<const DatasetSplits*>(kept.get());
  auto made = std::make_shared<DatasetSplits>(make());
  simulated_store_put(key, made);
  return *made;
#else
  (void)c;
  (void)dir;
  return make();
#endif
}

}  // namespace minidl
