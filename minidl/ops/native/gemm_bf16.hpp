// A linear layer's weight gradient g = a^T b (a [B, M] the output gradient dy, b [B, N] the input
// x) on AVX512-BF16 dot products, a block of rows at a time, for the weight's momentum update to
// read while it is in cache (matmul_sgd_momentum under --precision bf16), so that g is never
// written whole. The pairs of each dot product run along the batch: b is first packed into pairs
// of rows (words of two bf16, a zero row after an odd batch; in blocks of 64 columns), a's columns
// into pairs per row; a tile of up to 12 rows by up to 4 vectors of 16 columns then loads b's
// vectors once per pair of samples and broadcasts one word of a per row.
//
// Under --precision bf16 the unfused path writes the f32 gradient (4 MiB for the CIFAR CNN's fc1)
// and its update reads it back: on an AMD EPYC with AVX512-BF16 the product took 150-300 us per
// step and the update 150-240 more.
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
/// kernels (dot_bf16_unavailable(), native/dot_bf16.hpp).
std::string tn_bf16_refusal(bool trans_a, bool trans_b, std::int64_t N);

/// Words of b's pack: ceil(B / 2) * N.
std::int64_t tn_bf16_pack_words(std::int64_t B, std::int64_t N);

/// b [B, N] into `packed` (pairs of rows, see above).
void tn_bf16_pack(std::int64_t B, std::int64_t N, Bf16Factor b, std::uint32_t* packed);

/// The rows a block of tn_bf16_rows should have for N columns (its register tile's: 6 from 64
/// columns on, 8 or 12 for fewer).
std::int64_t tn_bf16_block_rows(std::int64_t N);

/// Rows [i0, i1) of g = a^T b (a [B, M], b packed) into g [i1 - i0, N], at most
/// tn_bf16_block_rows(N) rows. Each element sums its pairs in batch order.
void tn_bf16_rows(std::int64_t B, std::int64_t M, std::int64_t N, Bf16Factor a,
                  const std::uint32_t* packed_b, float* g, std::int64_t i0, std::int64_t i1);

}  // namespace minidl::native
