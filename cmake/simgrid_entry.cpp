// Linked into each program of the simulated build (cmake/simgrid.cmake). Such a program is a
// shared object that smpirun loads once per simulated rank; started directly, it would crash.
// This gives it an interpreter and an entry point that say how to run it instead.
#include <unistd.h>

#include <cstring>

extern "C" {
// NOLINTNEXTLINE: the dynamic loader's path, from the build machine's own programs.
__attribute__((section(".interp"), used)) const char minidl_simgrid_interp[] =
    MINIDL_SIMGRID_INTERP;

[[noreturn]] void minidl_simgrid_entry() {
  const char* text =
      "error: this program is built against SimGrid's SMPI (-DMINIDL_SIMGRID=ON): run it with "
      "smpirun (scripts/simulate-cluster), or use the real build\n";
  (void)!write(2, text, std::strlen(text));
  _exit(2);
}
}
