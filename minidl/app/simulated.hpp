// What a run on simulated hosts (a build against SimGrid's SMPI) does differently.
#pragma once

#include <functional>
#include <string>

#include "minidl/app/app.hpp"
#include "minidl/io/datasets.hpp"

namespace minidl {

/// In a simulated build: refuses what a simulated rank cannot do (several threads: SMPI
/// provides MPI_THREAD_SINGLE; --collective-timeout; --overlap), and sets one thread per rank and
/// the batches prepared on the rank's own thread. Does nothing in a real build.
void apply_simulated_rules(AppConfig& c);

/// The training and test sets, as make() prepares them from the flags and the data directory.
/// In a real build: make(). In a simulated build every simulated rank lives in one real process
/// and would hold a copy of the same data: the first rank's sets (read-only from then on) are
/// handed to the others, so memory does not grow with the simulated rank count.
DatasetSplits simulated_shared_data(const AppConfig& c, const std::string& dir,
                                    const std::function<DatasetSplits()>& make);

}  // namespace minidl
