// The machine's own compute limits on one core: the FLOP/s a loop of independent vector
// multiply-adds reaches, as f32 FMAs (vfmadd231ps) and as AVX512-BF16 dot products (vdpbf16ps).
// minidl_bench's peak rows time these loops; --precision bf16 compares the two on a CPU without
// AMX, where its products and convolutions compute on the dot products (a CPU whose dot products
// are slower than its FMAs trains slower in bf16 than in f32, and the user is told so).
#pragma once

#include <cstdint>
#include <string>

namespace minidl::native {

enum class PeakLoop {
  F32Fma,   // vfmadd231ps: 2 FLOP per f32 lane (AVX-512, or AVX2 with FMA)
  Bf16Dot,  // vdpbf16ps: 4 FLOP per f32 lane (two products and two sums; AVX512-BF16)
};

/// "" when this CPU runs `loop`, else why not.
std::string peak_loop_unavailable(PeakLoop loop);
/// The vector instructions `loop` runs on this CPU ("avx512", "avx2", "avx512bf16"; "" when it
/// cannot run).
std::string peak_loop_isa(PeakLoop loop);
/// FLOP one iteration of `loop` does on this CPU: 12 independent vector multiply-adds.
double peak_loop_flops(PeakLoop loop);
/// Runs `iterations` iterations of `loop` on the calling thread. Accumulator a (0 <= a < 12)
/// starts at a in every lane and gains 2 per iteration (f32: a * 1 + 2; bf16: a + 1 * 1 + 1 * 1,
/// exact below 2^24), so the result, the sum over every lane and accumulator, is
/// lanes * (66 + 24 * iterations): a caller can check that the loop ran.
/// peak_loop_unavailable(loop) must be "".
double run_peak_loop(PeakLoop loop, std::int64_t iterations);
/// The GFLOP/s of `loop` on the calling thread: the best of five runs of 2^15 iterations (half a
/// millisecond in all for f32 FMAs at 160 GFLOP/s, two for bf16 dot products at 80). 0 when the
/// CPU cannot run it.
double measure_peak(PeakLoop loop);

}  // namespace minidl::native
