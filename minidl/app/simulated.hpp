// What a run on simulated hosts (a build against SimGrid's SMPI) does differently.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "minidl/app/app.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl {

/// In a simulated build: refuses what a simulated rank cannot do (several threads: SMPI
/// provides MPI_THREAD_SINGLE; --collective-timeout; --overlap), and sets one thread per rank and
/// the batches prepared on the rank's own thread. In a real build: refuses --compute-table.
void apply_simulated_rules(AppConfig& c);

/// The training and test sets, as make() prepares them from the flags and the data directory.
/// In a real build: make(). In a simulated build every simulated rank lives in one real process
/// and would hold a copy of the same data: the first rank's sets (read-only from then on) are
/// handed to the others, so memory does not grow with the simulated rank count.
DatasetSplits simulated_shared_data(const AppConfig& c, const std::string& dir,
                                    const std::function<DatasetSplits()>& make);

/// --compute-table (a simulated build): the table's time of each node, spent with smpi_execute
/// instead of running its kernel (runtime::InjectedCompute). The table is JSON, {"nodes":
/// {NAME: [[ELEMENTS, SECONDS], ...]}}: seconds per call of the node called NAME, measured where
/// a call read and wrote ELEMENTS elements (runtime::node_elements; one point per batch size
/// measured), interpolated linearly in the elements between the points, extended past them
/// along the nearest two. A node the table lacks takes no time (rank 0 names it on stderr).
/// From this call on, every block of 64 KiB or more this rank allocates is SMPI's shared memory
/// (smpi_shared_malloc: every simulated rank's large buffers map the same pages, and messages
/// between them are not copied), smaller ones are zeroed (a loss no kernel wrote reads 0);
/// nothing a kernel would write is meaningful then, only the time. Null without the flag.
std::shared_ptr<const runtime::InjectedCompute> simulated_compute(const AppConfig& c);

}  // namespace minidl
