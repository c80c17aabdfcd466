// Native single-precision GEMM: the kernel behind linear layers and im2col convolution.
#pragma once

#include <cstdint>

namespace minidl::native {

/// Work fused into the GEMM store, applied after alpha/beta while the tile is still hot:
/// C = relu?(alpha * op(A) * op(B) + beta * C + bias).
struct GemmEpilogue {
  const float* bias = nullptr;  // [N], added to every row; nullptr for none
  bool relu = false;            // clamp at 0 after the bias; NaN becomes 0
};

/// Row-major C[M,N] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T.
/// A is [M,K] (or [K,M] when trans_a), B is [K,N] (or [N,K] when trans_b); lda/ldb/ldc are row
/// strides. beta == 0 means C is write-only (it may hold NaN garbage on entry and is ignored);
/// alpha == 0 or K == 0 leaves C = beta * C without reading A or B, as BLAS does.
/// Runs on the OpenMP threads unless called from inside a parallel region, then serially. Throws
/// minidl::Error for negative sizes or strides shorter than a row.
void sgemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
           std::int64_t ldc);

/// sgemm followed by the fused epilogue (bias over columns, then optional ReLU).
void sgemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
           std::int64_t ldc, const GemmEpilogue& epilogue);

/// An SGD-with-momentum update done by the GEMM's store instead of writing the product (a weight
/// gradient that only its update reads): C is the parameter p, velocity has C's layout (ldc), and
/// with g = alpha * op(A) * op(B), d = g + weight_decay * p:
///   velocity = momentum * velocity + d;  p -= lr * (nesterov ? d + momentum * velocity : velocity)
/// each tile updating its parameter and velocity elements while its gradient is in registers.
struct GemmMomentum {
  float* velocity = nullptr;
  float lr = 0.0f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

/// C (the parameter) and update.velocity updated by the product as GemmMomentum says, in one pass.
/// Returns false, touching nothing, where the store cannot do it: a micro-kernel other than
/// AVX-512's, or a K longer than one cache block (the update needs the finished sum); the caller
/// then computes the gradient and updates with it itself.
bool sgemm_momentum(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                    float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                    float* C, std::int64_t ldc, const GemmMomentum& update);

/// Name of the micro-kernel chosen at run time for this CPU ("avx512", "avx2", "generic"): the
/// widest one supported, unless MINIDL_GEMM_ISA (read once, at the first call) names another.
const char* sgemm_isa();

/// Forces the micro-kernel for later calls ("avx512", "avx2", "generic"), or restores the automatic
/// choice for nullptr or "". Meant for tests that cover every path; throws minidl::Error for an
/// unknown name or an ISA this CPU lacks. Calls already running keep the kernel they started with.
void sgemm_force_isa(const char* isa);

}  // namespace minidl::native
