// sgemm against a double-precision reference, on every micro-kernel this CPU can run.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/ops/native/gemm.hpp"

namespace minidl::native {
namespace {

using std::int64_t;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Written into the padding between rows of C; sgemm must leave it alone.
constexpr float kSentinel = -12345.0f;

/// Restores the automatic ISA choice when a test leaves, even through a failed assertion.
class ForceIsa {
 public:
  explicit ForceIsa(const char* isa) { sgemm_force_isa(isa); }
  ForceIsa(const ForceIsa&) = delete;
  ForceIsa& operator=(const ForceIsa&) = delete;
  ~ForceIsa() { sgemm_force_isa(nullptr); }
};

/// The ISAs this CPU can run; generic always, the SIMD ones when sgemm_force_isa accepts them.
std::vector<std::string> runnable_isas() {
  std::vector<std::string> isas = {"generic"};
  for (const char* isa : {"avx2", "avx512"}) {
    try {
      ForceIsa force(isa);
      isas.emplace_back(isa);
    } catch (const Error&) {  // not on this CPU
    }
  }
  return isas;
}

std::vector<float> random_vector(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

struct Case {
  bool trans_a = false;
  bool trans_b = false;
  int64_t M = 1, N = 1, K = 1;
  float alpha = 1.0f;
  float beta = 0.0f;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // extra floats per row beyond the logical width
  bool bias = false;
  bool relu = false;
};

std::string describe(const Case& c) {
  return detail::concat("ta=", c.trans_a, " tb=", c.trans_b, " M=", c.M, " N=", c.N, " K=", c.K,
                        " alpha=", c.alpha, " beta=", c.beta, " pads=", c.pad_a, "/", c.pad_b, "/",
                        c.pad_c, " bias=", c.bias, " relu=", c.relu);
}

/// Runs one case through sgemm and checks every element of C, padding included, against a double
/// reference. The tolerance grows with K because float rounding error accumulates along the sum.
void check_case(const Case& c, std::uint32_t seed = 1) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const int64_t a_rows = c.trans_a ? c.K : c.M, a_cols = c.trans_a ? c.M : c.K;
  const int64_t b_rows = c.trans_b ? c.N : c.K, b_cols = c.trans_b ? c.K : c.N;
  const int64_t lda = a_cols + c.pad_a, ldb = b_cols + c.pad_b, ldc = c.N + c.pad_c;
  const std::vector<float> A = random_vector(a_rows * lda, rng);
  const std::vector<float> B = random_vector(b_rows * ldb, rng);
  const std::vector<float> bias = random_vector(c.N, rng);
  std::vector<float> C = random_vector(c.M * ldc, rng);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = c.N; j < ldc; ++j) C[i * ldc + j] = kSentinel;
  }
  // beta == 0 promises that C is not read: poison it so any read shows up as NaN.
  if (c.beta == 0.0f) {
    for (int64_t i = 0; i < c.M; ++i) {
      for (int64_t j = 0; j < c.N; ++j) C[i * ldc + j] = kNaN;
    }
  }
  const std::vector<float> C0 = C;

  GemmEpilogue epilogue;
  epilogue.bias = c.bias ? bias.data() : nullptr;
  epilogue.relu = c.relu;
  sgemm(c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta,
        C.data(), ldc, epilogue);

  const double eps = std::numeric_limits<float>::epsilon();
  int64_t failures = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= c.N) {
        EXPECT_EQ(got, kSentinel) << "padding overwritten at row " << i << " col " << j;
        continue;
      }
      double dot = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.trans_a ? A[k * lda + i] : A[i * lda + k];
        const double b = c.trans_b ? B[j * ldb + k] : B[k * ldb + j];
        dot += a * b;
        magnitude += std::abs(a * b);
      }
      double want = c.alpha * dot;
      magnitude *= std::abs(c.alpha);
      if (c.beta != 0.0f) {
        want += c.beta * static_cast<double>(C0[i * ldc + j]);
        magnitude += std::abs(c.beta * C0[i * ldc + j]);
      }
      if (c.bias) {
        want += bias[j];
        magnitude += std::abs(bias[j]);
      }
      if (c.relu) want = want > 0.0 ? want : 0.0;
      const double tol = 2.0 * eps * static_cast<double>(c.K + 4) * magnitude + 1e-30;
      if (!(std::abs(got - want) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", want " << want << " (tol "
                      << tol << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << "mismatching elements";
}

/// Every transpose combination for one shape and set of scalars.
void check_all_transposes(Case c) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      c.trans_a = ta;
      c.trans_b = tb;
      check_case(c);
    }
  }
}

struct Shape3 {
  int64_t M, N, K;
};

// Odd sizes, sizes around the tile widths (MR is 4/6/8, NR 16/48) and the MLP training shapes.
const Shape3 kShapes[] = {{1, 1, 1},     {7, 13, 5},     {33, 65, 17},   {8, 32, 16}, {9, 33, 3},
                          {8, 48, 16},   {9, 49, 3},     {16, 97, 8},    {6, 16, 1},  {5, 17, 31},
                          {64, 10, 128}, {64, 128, 10},  {10, 128, 64},  {1, 257, 9}, {95, 1, 40},
                          {48, 47, 129}, {17, 100, 300}, {32, 10, 1352}, {3, 16, 16}, {5, 13, 47}};

TEST(Gemm, MatchesReferenceOnEveryIsa) {
  for (const std::string& isa : runnable_isas()) {
    ForceIsa force(isa.c_str());
    ASSERT_EQ(std::string(sgemm_isa()), isa);
    SCOPED_TRACE("isa=" + isa);
    for (const Shape3& s : kShapes) {
      Case c;
      c.M = s.M;
      c.N = s.N;
      c.K = s.K;
      check_all_transposes(c);
    }
  }
}

TEST(Gemm, AlphaBetaAndStrides) {
  for (const std::string& isa : runnable_isas()) {
    ForceIsa force(isa.c_str());
    SCOPED_TRACE("isa=" + isa);
    for (const float alpha : {1.0f, -0.5f, 2.0f}) {
      for (const float beta : {0.0f, 1.0f, -1.5f}) {
        Case c;
        c.M = 37;
        c.N = 100;  // two full panels of 48 (read in place by the first tile) and an edge
        c.K = 23;
        c.alpha = alpha;
        c.beta = beta;
        c.pad_a = 3;
        c.pad_b = 5;
        c.pad_c = 7;
        check_all_transposes(c);
      }
    }
  }
}

// Sizes past the cache blocks (MC <= 256, KC <= 256, NC <= 2048 on every ISA) exercise every loop
// of the driver, both macro-kernel loop orders, beta on the first K block only, and the threads.
TEST(Gemm, LargerThanCacheBlocks) {
  for (const std::string& isa : runnable_isas()) {
    ForceIsa force(isa.c_str());
    SCOPED_TRACE("isa=" + isa);
    Case c;
    c.M = 270;
    c.N = 60;
    c.K = 300;
    c.beta = 0.5f;
    c.pad_a = 1;
    c.pad_b = 2;
    c.pad_c = 3;
    check_all_transposes(c);
    check_case({true, false, 20, 2100, 100, -1.0f, 0.0f, 0, 0, 5});
    // One A block and one k block whose C outgrows the cache (1.08 MB a thread on two threads,
    // twice that on one): the tiles go along C's rows.
    check_case({false, true, 256, 2100, 40, 1.0f, 0.0f, 0, 1, 2});
  }
}

TEST(Gemm, ZeroKScalesC) {
  for (const float beta : {0.0f, 1.0f, -2.0f}) {
    Case c;
    c.M = 5;
    c.N = 9;
    c.K = 0;
    c.beta = beta;
    c.pad_c = 2;
    check_all_transposes(c);
    c.bias = true;
    c.relu = true;
    check_case(c);
  }
}

TEST(Gemm, ZeroAlphaIgnoresInputs) {
  // alpha == 0 must not multiply NaN inputs into C: BLAS treats it as C = beta * C.
  std::vector<float> A(6, kNaN), B(6, kNaN), C = {1, 2, 3, 4};
  sgemm(false, false, 2, 2, 3, 0.0f, A.data(), 3, B.data(), 2, 2.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{2, 4, 6, 8}));
}

TEST(Gemm, EmptyOutputIsNoOp) {
  float c = 7.0f;
  sgemm(false, false, 0, 1, 4, 1.0f, nullptr, 4, nullptr, 1, 0.0f, &c, 1);
  sgemm(false, false, 1, 0, 4, 1.0f, nullptr, 4, nullptr, 0, 0.0f, &c, 0);
  EXPECT_EQ(c, 7.0f);
}

TEST(Gemm, Epilogue) {
  for (const std::string& isa : runnable_isas()) {
    ForceIsa force(isa.c_str());
    SCOPED_TRACE("isa=" + isa);
    // K = 600 spans several K blocks: bias and ReLU must land once, after the last one.
    for (const Shape3& s :
         {Shape3{7, 13, 5}, Shape3{33, 65, 17}, Shape3{64, 10, 600}, Shape3{20, 48, 9}}) {
      for (const bool bias : {false, true}) {
        for (const bool relu : {false, true}) {
          for (const float beta : {0.0f, 1.0f}) {
            Case c;
            c.M = s.M;
            c.N = s.N;
            c.K = s.K;
            c.alpha = 0.5f;
            c.beta = beta;
            c.pad_c = 1;
            c.bias = bias;
            c.relu = relu;
            check_all_transposes(c);
          }
        }
      }
    }
    // Several A blocks switch the driver to its other loop order; K spans two blocks.
    Case c;
    c.M = 270;
    c.N = 50;
    c.K = 300;
    c.beta = 1.0f;
    c.bias = true;
    c.relu = true;
    check_all_transposes(c);
  }
}

/// sgemm_momentum on one shape against the update applied in double to a double product; the
/// padding between rows of the parameter and velocity stays untouched.
void check_momentum(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const GemmMomentum& rule) {
  SCOPED_TRACE(detail::concat("ta=", ta, " tb=", tb, " M=", M, " N=", N, " K=", K,
                              " nesterov=", rule.nesterov, " wd=", rule.weight_decay));
  std::mt19937 rng(11);
  const int64_t lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
  const std::vector<float> A = random_vector((ta ? K : M) * lda, rng);
  const std::vector<float> B = random_vector((tb ? N : K) * ldb, rng);
  std::vector<float> P = random_vector(M * ldc, rng), V = random_vector(M * ldc, rng);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = N; j < ldc; ++j) P[i * ldc + j] = V[i * ldc + j] = kSentinel;
  }
  const std::vector<float> P0 = P, V0 = V;
  GemmMomentum u = rule;
  u.velocity = V.data();
  const float alpha = 0.5f;
  ASSERT_TRUE(
      sgemm_momentum(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, P.data(), ldc, u));
  const double eps = std::numeric_limits<float>::epsilon();
  int64_t failures = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const int64_t at = i * ldc + j;
      if (j >= N) {
        EXPECT_TRUE(P[at] == kSentinel && V[at] == kSentinel) << "padding overwritten at " << at;
        continue;
      }
      double dot = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + i] : A[i * lda + k];
        const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
        dot += a * b;
        magnitude += std::abs(a * b);
      }
      const double d = alpha * dot + rule.weight_decay * double{P0[at]};
      const double v = rule.momentum * double{V0[at]} + d;
      const double p = P0[at] - rule.lr * (rule.nesterov ? d + rule.momentum * v : v);
      const double tol = 4.0 * eps * (static_cast<double>(K + 4) * magnitude + 4.0);
      if (!(std::abs(V[at] - v) <= tol && std::abs(P[at] - p) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << "at " << i << "," << j << ": p " << P[at] << " (want " << p << "), v "
                      << V[at] << " (want " << v << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << "mismatching elements";
}

TEST(Gemm, MomentumUpdateInTheStore) {
  std::vector<std::string> isas = runnable_isas();
  if (isas.back() != "avx512") GTEST_SKIP() << "the update store is AVX-512's; this CPU has none";
  ForceIsa force("avx512");
  // Edge tiles in both directions, one row, several A blocks (mc = 256), K = 1 and K = kc = 192,
  // the CIFAR CNN's first linear layer (M 256, N 4096, K 32: two threads split it).
  for (const Shape3& s : {Shape3{37, 100, 32}, Shape3{1, 17, 5}, Shape3{300, 70, 192},
                          Shape3{8, 48, 1}, Shape3{256, 4096, 32}}) {
    for (const bool nesterov : {false, true}) {
      const GemmMomentum rule{nullptr, 0.1f, 0.9f, nesterov ? 0.01f : 0.0f, nesterov};
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) check_momentum(ta, tb, s.M, s.N, s.K, rule);
    }
  }
}

TEST(Gemm, MomentumUpdateDeclinesWhatItCannotStore) {
  // K past one cache block (the update needs the finished sum), and the other micro-kernels:
  // false, and nothing written.
  std::vector<float> A(8 * 200, 1.0f), B(200 * 16, 1.0f), P(8 * 16, 2.0f), V(8 * 16, 3.0f);
  GemmMomentum u{V.data(), 0.1f, 0.9f, 0.0f, false};
  std::vector<std::string> isas = runnable_isas();
  for (const std::string& isa : isas) {
    ForceIsa force(isa.c_str());
    SCOPED_TRACE("isa=" + isa);
    if (isa == "avx512") {
      EXPECT_FALSE(sgemm_momentum(false, false, 8, 16, 200, 1.0f, A.data(), 200, B.data(), 16,
                                  P.data(), 16, u));
    } else {
      EXPECT_FALSE(sgemm_momentum(false, false, 8, 16, 8, 1.0f, A.data(), 200, B.data(), 16,
                                  P.data(), 16, u));
    }
    EXPECT_EQ(P, std::vector<float>(8 * 16, 2.0f));
    EXPECT_EQ(V, std::vector<float>(8 * 16, 3.0f));
  }
}

TEST(Gemm, InsideParallelRegionRunsSerially) {
  // Each thread runs its own product; sgemm must not fork nested teams or share pack buffers.
  const int64_t M = 50, N = 70, K = 90;
  std::mt19937 rng(3);
  const std::vector<float> A = random_vector(M * K, rng), B = random_vector(K * N, rng);
  std::vector<float> want(M * N);
  sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want.data(), N);
  std::vector<std::vector<float>> got(4, std::vector<float>(M * N, kNaN));
#pragma omp parallel for num_threads(2)
  for (int t = 0; t < 4; ++t) {
    sgemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, got[t].data(), N);
  }
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], want) << "product " << t;
}

TEST(Gemm, ThreadCountDoesNotChangeResult) {
  // Threads split C into disjoint tiles and never split K, so results are bitwise identical.
  // The shapes make the partition split columns (wide C) and rows (tall, narrow C). The last one
  // is one A block and one k block whose C (1.08 MB) outgrows the cache on one thread, so its tiles
  // go along C's rows there, and down the columns in each thread's half: the same bits.
  const int saved = omp_get_max_threads();
  for (const Shape3& s : {Shape3{130, 300, 700}, Shape3{600, 20, 300}, Shape3{64, 256, 128},
                          Shape3{900, 10, 300}, Shape3{2000, 128, 10}, Shape3{128, 2100, 40}}) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        SCOPED_TRACE(
            detail::concat("M=", s.M, " N=", s.N, " K=", s.K, " ta=", trans_a, " tb=", trans_b));
        std::mt19937 rng(4);
        const std::vector<float> A = random_vector(s.M * s.K, rng);
        const std::vector<float> B = random_vector(s.K * s.N, rng);
        const int64_t lda = trans_a ? s.M : s.K, ldb = trans_b ? s.K : s.N;
        std::vector<float> one(s.M * s.N), two(s.M * s.N, kNaN);
        omp_set_num_threads(1);
        sgemm(trans_a, trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, one.data(),
              s.N);
        omp_set_num_threads(2);
        sgemm(trans_a, trans_b, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, two.data(),
              s.N);
        EXPECT_EQ(one, two);
      }
    }
  }
  omp_set_num_threads(saved);
}

// A classifier's forward (A untransposed, B transposed, at most 16 columns): the narrow kernel
// takes rows of A two at a time when N <= 12. Each row has the bits it has when computed alone
// (a product of one row), for an odd row count, across that N, and with a K tail.
TEST(Gemm, NarrowRowsInPairsMatchRowsAlone) {
  for (const int64_t n : {1, 10, 12, 13, 16}) {
    for (const int64_t k : {5, 40, 1352}) {
      SCOPED_TRACE(detail::concat("N=", n, " K=", k));
      const int64_t m = 7;
      std::mt19937 rng(6);
      const std::vector<float> A = random_vector(m * k, rng), B = random_vector(n * k, rng);
      std::vector<float> all(m * n, kNaN), alone(m * n, kNaN);
      sgemm(false, true, m, n, k, 1.0f, A.data(), k, B.data(), k, 0.0f, all.data(), n);
      for (int64_t i = 0; i < m; ++i) {
        sgemm(false, true, 1, n, k, 1.0f, A.data() + i * k, k, B.data(), k, 0.0f,
              alone.data() + i * n, n);
      }
      EXPECT_EQ(all, alone);
    }
  }
}

TEST(Gemm, RejectsBadArguments) {
  std::vector<float> A(64), B(64), C(64);
  EXPECT_THROW(sgemm(false, false, -1, 2, 2, 1.0f, A.data(), 2, B.data(), 2, 0.0f, C.data(), 2),
               Error);
  // lda smaller than the K columns of a non-transposed A.
  EXPECT_THROW(sgemm(false, false, 2, 2, 4, 1.0f, A.data(), 3, B.data(), 2, 0.0f, C.data(), 2),
               Error);
  EXPECT_THROW(sgemm(false, true, 2, 2, 4, 1.0f, A.data(), 4, B.data(), 3, 0.0f, C.data(), 2),
               Error);
  EXPECT_THROW(sgemm(false, false, 2, 4, 2, 1.0f, A.data(), 2, B.data(), 4, 0.0f, C.data(), 3),
               Error);
}

TEST(Gemm, ForceIsaValidatesName) {
  EXPECT_THROW(sgemm_force_isa("sse9"), Error);
  {
    ForceIsa force("generic");
    EXPECT_STREQ(sgemm_isa(), "generic");
  }
  const std::string automatic = sgemm_isa();
  EXPECT_TRUE(automatic == "avx512" || automatic == "avx2" || automatic == "generic") << automatic;
}

}  // namespace
}  // namespace minidl::native
