// What the native AMX-BF16 kernels share (conv_amx, gemm_amx, gemm_bf16): whether this CPU and its
// operating system run them, and the one tile shape they use. An AMX tile register holds up to 16
// rows of 64 bytes; tdpbf16ps adds to an f32 tile C [16][16] the product of a bf16 tile A [16][32]
// and a tile B of 16 rows of 16 pairs: C[m][n] += sum over k < 16 of A[m][2k] B[k][2n] +
// A[m][2k + 1] B[k][2n + 1]. The pairs of B run along the sum, so an operand whose sum runs along
// its rows is packed into pairs of rows first (the layout oneDNN calls VNNI).
#pragma once

#include <cstdint>
#include <string>

namespace minidl::native {

/// "" when this CPU has AMX-BF16 (with AMX-TILE, and AVX512-BF16 for the packing), the operating
/// system lets this process use the
/// tile registers (Linux: arch_prctl ARCH_REQ_XCOMP_PERM, asked once), and MINIDL_NATIVE_BF16 is
/// not off; else why not.
std::string amx_bf16_unavailable();

namespace amx {

constexpr std::int64_t kRows = 16;      // rows of a tile
constexpr std::int64_t kRowBytes = 64;  // bytes of a tile row: 16 f32 or 32 bf16
constexpr std::int64_t kPairs = 16;     // pairs of bf16 in a row of B (16 f32 columns of C)
constexpr std::int64_t kDepth = 32;     // bf16 terms each tdpbf16ps adds to a sum

/// Configures every tile of the calling thread as 16 rows of 64 bytes (the only shape the kernels
/// use). The kernels call it first and leave the tiles configured, as oneDNN's do (each kernel,
/// theirs too, loads its own configuration): releasing them after every call (tilerelease) came
/// with 5-10% longer steps in the oneDNN kernels around (--profile, CIFAR CNN, bf16). A thread
/// whose tiles are configured so already skips the load (ldtilecfg, which also zeroes them).
void configure();

}  // namespace amx
}  // namespace minidl::native
