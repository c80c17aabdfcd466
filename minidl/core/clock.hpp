// The clock every time minidl reports (epoch times, the profile's split, the trace) is read
// from: std::chrono::steady_clock, unless a communicator installs another source. A program
// built against SimGrid's SMPI runs on simulated hosts, and there only the simulated time
// (MPI_Wtime) means anything; parallel installs it.
#pragma once

#include <chrono>

namespace minidl {

/// A std::chrono clock (steady) reading the installed source, in seconds.
struct Clock {
  using rep = double;
  using period = std::ratio<1>;
  using duration = std::chrono::duration<double>;
  using time_point = std::chrono::time_point<Clock>;
  static constexpr bool is_steady = true;
  static time_point now();
};

/// Makes Clock read `seconds` (monotonic, any origin); nullptr restores steady_clock.
void set_clock_source(double (*seconds)());

}  // namespace minidl
