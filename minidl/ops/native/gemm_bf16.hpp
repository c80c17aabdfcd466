// A linear layer's weight gradient g = a^T b (a [B, M] the output gradient dy, b [B, N] the input
// x) in bf16, a block of rows at a time, for the weight's momentum update to read while it is in
// cache (matmul_sgd_momentum under --precision bf16), so that g is never written whole. The
// pairs of each sum run along the batch: b is first packed into pairs of rows (words of two
// bf16, a zero row after an odd batch). On AMX tiles (amx_bf16.hpp) where the CPU has AMX-BF16:
// blocks of 16 rows, a's columns the rows of an A tile, each 16 columns of b's pairs one B tile
// (the pack holds them in runs of 1 KiB). On AVX512-BF16 dot products otherwise: b's pairs in
// blocks of 64 columns, a's columns into pairs per row; a register tile of up to 12 rows by up to
// 4 vectors of 16 columns then loads b's vectors once per pair of samples and broadcasts one word
// of a per row.
//
// Under --precision bf16 the unfused path writes the f32 gradient (4 MiB for the CIFAR CNN's fc1)
// and its update reads it back: on an AMD EPYC with AVX512-BF16 the product took 150-300 us per
// step and the update 150-240 more; on an Intel Xeon with AMX, oneDNN's product 218-274 us (245
// GFLOP/s) and the update 235.
#pragma once

#include <cstdint>
#include <string>

namespace minidl::native {

/// One factor: bf16 bits (the upper halves of f32 values) or f32 values, rounded when packed;
/// row-major, rows of its own length.
struct Bf16Factor {
  const void* data = nullptr;
  bool bf16 = false;
};

/// Why the kernel cannot take a product op(a) op(b) with N columns, or "": it takes a^T b (the
/// weight gradient of y = x w^T) with N a multiple of 16, on a CPU that runs the native bf16
/// kernels (amx_bf16_unavailable() or dot_bf16_unavailable()).
std::string tn_bf16_refusal(bool trans_a, bool trans_b, std::int64_t N);

/// Words of b's pack: ceil(B / 2) * N (on AMX rounded up to 16 pairs).
std::int64_t tn_bf16_pack_words(std::int64_t B, std::int64_t N);

/// b [B, N] into `packed` (pairs of rows, see above).
void tn_bf16_pack(std::int64_t B, std::int64_t N, Bf16Factor b, std::uint32_t* packed);

/// The rows a block of tn_bf16_block should have for N columns (16 on AMX; else its register
/// tile's: 6 from 64 columns on, 8 or 12 for fewer).
std::int64_t tn_bf16_block_rows(std::int64_t N);

/// Words of a block's pack of a's columns (tn_bf16_pack_rows).
std::int64_t tn_bf16_rows_pack_words(std::int64_t B);

/// The columns [i0, i1) of a [B, M], rows [i0, i1) of g, into `rows`: at most
/// tn_bf16_block_rows(N) of them.
void tn_bf16_pack_rows(std::int64_t B, std::int64_t M, Bf16Factor a, std::int64_t i0,
                       std::int64_t i1, std::uint32_t* rows);

/// Columns [j0, j1) of those R rows of g = a^T b (b packed) into g [R, j1 - j0] (rows ldg >=
/// j1 - j0 floats apart; j0 a multiple of 64, j1 - j0 of 16); g must hold
/// tn_bf16_block_rows(N) rows (AMX writes whole tiles). Each element sums its pairs in batch
/// order (on AMX in runs of 32 samples, each run in the tile's order).
void tn_bf16_block(std::int64_t B, std::int64_t R, const std::uint32_t* rows,
                   const std::uint32_t* packed_b, float* g, std::int64_t ldg, std::int64_t j0,
                   std::int64_t j1);

}  // namespace minidl::native
