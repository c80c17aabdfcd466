#include <gtest/gtest.h>

#include "harness.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;

static const std::vector<BadCase> kBad = {
    {{{4}, {4}, {}, {3, 5}}, {DType::F32, DType::F32, DType::I64}, {}, "must be f32 [5] to match"},
    {{{4}, {4}, {}, {2, 4}}, {DType::F32, DType::F32, DType::I64}, {}, "expected f32 stats [3,C]"},
    {{{4}, {4}, {1}, {3, 4}},
     {DType::F32, DType::F32, DType::I64},
     {},
     "num_batches_tracked must be an i64 scalar [], got [1]"},
    {{{4}, {4}, {}, {3, 4}}, {DType::F32, DType::F32, DType::F32}, {}, "got [] f32"},
    {{{4}, {4}, {}, {3, 4}},
     {DType::F32, DType::F32, DType::I64},
     {{"momentum", 1.5}},
     "momentum must be in [0, 1]"},
};
MINIDL_OP_TEST(bn_update_running, std::vector<OpCase>{}, kBad)

// PyTorch: running = (1 - m) running + m batch, the batch variance unbiased (n / (n - 1)).
TEST(BnUpdateRunning, PyTorchsFormulasInPlace) {
  Tensor rmean = Tensor::from(Shape{2}, std::vector<float>{0.5f, -1.0f});
  Tensor rvar = Tensor::from(Shape{2}, std::vector<float>{1.0f, 2.0f});
  Tensor tracked = Tensor::zeros({}, DType::I64);
  // Channel 0: values {1, 2, 3, 6}; channel 1: {-1, 1, 0, 0}.
  Tensor stats = Tensor::from(Shape{3, 2}, std::vector<float>{4, 4, 12, 0, 1 + 4 + 9 + 36, 1 + 1});
  ir::Graph g;
  ops::bn_update_running(ops::state(g, "running_mean", rmean), ops::state(g, "running_var", rvar),
                         ops::state(g, "num_batches_tracked", tracked),
                         ops::state(g, "stats", stats), 0.25);
  runtime::Executable exe(g);
  double m0 = 0.5, m1 = -1.0, v0 = 1.0, v1 = 2.0;
  for (int step = 1; step <= 2; ++step) {
    exe.run();
    m0 = 0.75 * m0 + 0.25 * 3.0;
    m1 = 0.75 * m1 + 0.25 * 0.0;
    v0 = 0.75 * v0 + 0.25 * (4.0 + 1.0 + 0.0 + 9.0) / 3.0;
    v1 = 0.75 * v1 + 0.25 * 2.0 / 3.0;
    EXPECT_NEAR(rmean.at(0), m0, 1e-6);
    EXPECT_NEAR(rmean.at(1), m1, 1e-6);
    EXPECT_NEAR(rvar.at(0), v0, 1e-6);
    EXPECT_NEAR(rvar.at(1), v1, 1e-6);
    EXPECT_EQ(*tracked.data<std::int64_t>(), step);
  }
}
