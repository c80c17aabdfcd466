// Denormal (subnormal) floating-point numbers: whether the CPU flushes them to zero.
//
// Arithmetic that produces or reads a subnormal f32 (|x| < 2^-126) can take a slow microcode path
// on x86. Flush mode sets MXCSR's flush-to-zero (FTZ, bit 15: subnormal results become 0) and
// denormals-are-zero (DAZ, bit 6: subnormal operands read as 0). MXCSR belongs to one thread, so
// set_denormals() sets it on the calling thread and on every thread of OpenMP's pool; threads
// created afterwards inherit the creating thread's setting (pthread_create copies the
// floating-point environment), which covers OpenMP threads added later (oneDNN's included: it
// runs on OpenMP's threads) and std::threads such as the trainer's prefetch thread.
#pragma once

#include <string_view>

namespace minidl {

enum class Denormals {
  Keep,   // IEEE gradual underflow (the CPU's default)
  Flush,  // FTZ and DAZ: subnormal results and operands are zero
};

/// Sets mode on the calling thread and on every thread of OpenMP's pool (see above), and
/// remembers it: set_num_threads() applies it again to the threads a larger pool adds. On a CPU
/// other than x86 it does nothing (flushing_denormals() then stays false).
void set_denormals(Denormals mode);

/// The mode set last by set_denormals (Keep before any call).
Denormals denormals_mode();

/// True when the calling thread has both FTZ and DAZ set.
bool flushing_denormals();

/// Applies the remembered mode (set_denormals) to every thread of OpenMP's pool; does nothing if
/// set_denormals was never called.
void apply_denormals_to_threads();

/// "keep" or "flush".
std::string_view denormals_name(Denormals mode);

}  // namespace minidl
