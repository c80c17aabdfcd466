#include "minidl/core/denormals.hpp"

#include <omp.h>

#include <atomic>

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#define MINIDL_HAVE_MXCSR 1
#else
#define MINIDL_HAVE_MXCSR 0
#endif

namespace minidl {
namespace {

// -1: never set (leave every thread as it is); else a Denormals value.
std::atomic<int> g_mode{-1};

void apply_here(Denormals mode) {
#if MINIDL_HAVE_MXCSR
  const bool flush = mode == Denormals::Flush;
  _MM_SET_FLUSH_ZERO_MODE(flush ? _MM_FLUSH_ZERO_ON : _MM_FLUSH_ZERO_OFF);
  _MM_SET_DENORMALS_ZERO_MODE(flush ? _MM_DENORMALS_ZERO_ON : _MM_DENORMALS_ZERO_OFF);
#else
  (void)mode;
#endif
}

}  // namespace

void set_denormals(Denormals mode) {
  g_mode.store(static_cast<int>(mode));
  apply_here(mode);
  apply_denormals_to_threads();
}

Denormals denormals_mode() {
  const int m = g_mode.load();
  return m < 0 ? Denormals::Keep : static_cast<Denormals>(m);
}

bool flushing_denormals() {
#if MINIDL_HAVE_MXCSR
  constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;
  return (_mm_getcsr() & (kFtz | kDaz)) == (kFtz | kDaz);
#else
  return false;
#endif
}

void apply_denormals_to_threads() {
  const int m = g_mode.load();
  if (m < 0) return;
  const auto mode = static_cast<Denormals>(m);
  apply_here(mode);
  if (omp_in_parallel()) return;  // the pool's other threads are busy; they inherited it
#pragma omp parallel num_threads(omp_get_max_threads())
  apply_here(mode);
}

std::string_view denormals_name(Denormals mode) {
  return mode == Denormals::Flush ? "flush" : "keep";
}

}  // namespace minidl
