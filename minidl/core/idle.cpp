#include "minidl/core/idle.hpp"

namespace minidl {
namespace {
thread_local bool wanted = false;
thread_local double noted = 0.0;
}  // namespace

bool idle_wanted() { return wanted; }
void set_idle_wanted(bool on) { wanted = on; }
void note_idle(double seconds) { noted += seconds; }
double take_idle() {
  const double s = noted;
  noted = 0.0;
  return s;
}

}  // namespace minidl
