#include "minidl/ops/native/dot_bf16.hpp"

#include "minidl/core/log.hpp"

namespace minidl::native {

std::string dot_bf16_unavailable() {
#if defined(__x86_64__)
  static const std::string why = [] {
    if (!env_switch("MINIDL_NATIVE_BF16")) return std::string("switched off (MINIDL_NATIVE_BF16)");
    if (!(__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl")))
      return std::string("needs a CPU with AVX512-BF16 (and AVX-512 BW, VL)");
    if (__builtin_cpu_supports("amx-bf16"))
      return std::string("leaves CPUs with AMX-BF16 to oneDNN's tile kernels");
    return std::string();
  }();
  return why;
#else
  return "needs an x86-64 CPU with AVX512-BF16";
#endif
}

}  // namespace minidl::native
