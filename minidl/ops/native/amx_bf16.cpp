#include "minidl/ops/native/amx_bf16.hpp"

#include <cstdint>
#include <cstring>

#include "minidl/core/log.hpp"

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MINIDL_AMX 1
#else
#define MINIDL_AMX 0
#endif

namespace minidl::native {

std::string amx_bf16_unavailable() {
#if MINIDL_AMX
  static const std::string why = [] {
    if (!env_switch("MINIDL_NATIVE_BF16")) return std::string("switched off (MINIDL_NATIVE_BF16)");
    if (!(__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16")))
      return std::string("needs a CPU with AMX-BF16");
    // The kernels pack their operands with AVX-512 (every CPU with AMX so far has it).
    if (!(__builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl")))
      return std::string("needs AVX512-BF16 (with AVX-512 BW, VL) beside AMX-BF16");
    // Linux hands out the tile registers' state only to a process that asks for it.
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) != 0)
      return std::string("the operating system refused the AMX tile state (arch_prctl)");
    return std::string();
  }();
  return why;
#else
  return "needs an x86-64 Linux machine with AMX-BF16";
#endif
}

namespace amx {

#if MINIDL_AMX
namespace {
/// The 64-byte operand of ldtilecfg (palette 1): tiles 0-7 of 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {kRowBytes, kRowBytes, kRowBytes, kRowBytes,
                             kRowBytes, kRowBytes, kRowBytes, kRowBytes};
  std::uint8_t rows[16] = {kRows, kRows, kRows, kRows, kRows, kRows, kRows, kRows};
};
static_assert(sizeof(TileConfig) == 64);
// In static storage: GCC 12 takes ldtilecfg's operand for its first bytes only and dropped the
// stores of a local configuration's rows and columns (the instruction then faults).
constexpr TileConfig kConfig;
}  // namespace

// The kernels configure the tiles for every sample (and oneDNN's AMX kernels load configurations
// of their own in between): the thread's configuration is read first and loaded only when it
// differs. ldtilecfg took 53 ns, sttilecfg and the comparison 7.6 ns (a loop of a million calls
// on the Intel Xeon with AMX), against about 200 calls per step of the CIFAR CNN.
__attribute__((target("amx-tile"))) void configure() {
  TileConfig now;
  _tile_storeconfig(&now);
  if (std::memcmp(&now, &kConfig, sizeof now) == 0) return;
  _tile_loadconfig(&kConfig);
}

#else
void configure() {}
#endif

}  // namespace amx
}  // namespace minidl::native
