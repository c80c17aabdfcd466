// The tensor-parallel collective ops under mpirun (ctest runs 2 and 3 ranks), all ranks one
// group of shards: each forward against the serial formula, and each gradient rule (the
// transposed collective) against central finite differences of the loss summed over the
// ranks, every rank's input perturbed in turn; a bad input is refused on every rank.
#include <gmock/gmock.h>

#include <cmath>
#include <functional>

#include "minidl/autograd/autograd.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/tensor_parallel.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace {

// Rank r's x[i]: distinct values, exact in f32, sums exact too.
float value(int r, std::int64_t i) { return 0.25f * static_cast<float>(r) + 0.125f * i - 1.0f; }

Tensor filled(int r, const Shape& s) {
  Tensor t = Tensor::empty(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = value(r, i);
  return t;
}

using Op = std::function<ir::Value*(ir::Value*)>;

// y = op(x) for this rank's x; loss = sum(y * w_r), with w_r a rank's own weights.
struct Case {
  ir::Graph g;
  Tensor x, w;
  ir::Value *y = nullptr, *loss = nullptr, *dx = nullptr;
  std::unique_ptr<runtime::Executable> exe;
  Case(const Shape& in, const Op& op, int r) : x(filled(r, in)) {
    ir::Value* xv = ops::parameter(g, "x", x);
    y = op(xv);
    w = Tensor::empty(y->shape());
    for (std::int64_t i = 0; i < w.numel(); ++i)
      w.data<float>()[i] = std::sin(1.0f + 0.7f * static_cast<float>(i) + 1.3f * r);
    loss = ops::sum(ops::mul(y, ops::parameter(g, "w", w)));
    dx = autograd::differentiate(g, loss, {xv})[0];
    g.add_output(y);
    g.add_output(loss);
    g.add_output(dx);
    exe = std::make_unique<runtime::Executable>(g);
  }
  // The loss summed over the ranks, after one run.
  double total(parallel::Communicator& comm) {
    exe->run();
    double l = exe->value(loss).at(0);
    comm.allreduce_sum(&l, 1);
    return l;
  }
};

// d(sum over ranks of loss)/dx on this rank, by central differences: every rank's elements
// are perturbed in turn, all ranks running every step.
void check_gradient(const Shape& in, const Op& op, const char* what) {
  parallel::Communicator& comm = parallel::world();
  const int p = comm.size(), me = comm.rank();
  Case c(in, op, me);
  c.exe->run();
  const Tensor analytic = c.exe->value(c.dx).clone();
  const double h = 1e-2;
  for (int q = 0; q < p; ++q) {
    for (std::int64_t i = 0; i < c.x.numel(); ++i) {
      float* xi = c.x.data<float>() + i;
      const float keep = *xi;
      if (me == q) *xi = keep + static_cast<float>(h);
      const double up = c.total(comm);
      if (me == q) *xi = keep - static_cast<float>(h);
      const double down = c.total(comm);
      if (me == q) *xi = keep;
      if (me != q) continue;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic.at(i), numeric, 1e-3 * (1 + std::abs(numeric)))
          << what << ": rank " << q << " element " << i;
    }
  }
}

}  // namespace

TEST(MpiTensorParallel, ForwardMatchesTheSerialFormulas) {
  parallel::Communicator& comm = parallel::world();
  const int p = comm.size(), r = comm.rank();
  ASSERT_GT(p, 1) << "run this test under mpirun with at least 2 ranks";
  ir::Graph g;
  Tensor a = filled(r, {3, 4}), b = filled(r, {2, 3}), c = filled(r, {2, 3 * p}),
         d = filled(r, {3 * p, 2});
  ir::Value* copied = parallel::tp_copy(ops::parameter(g, "a", a), 0);
  ir::Value* reduced = parallel::tp_reduce(ops::parameter(g, "b", b), 0);
  ir::Value* scattered = parallel::tp_scatter(ops::parameter(g, "c", c), -1, 0);
  ir::Value* rows = parallel::tp_scatter(ops::parameter(g, "d", d), 0, 0);
  ir::Value* gathered = parallel::tp_gather(ops::parameter(g, "b2", b), 1, 0);
  ir::Value* gathered0 = parallel::tp_gather(ops::parameter(g, "a2", a), 0, 0);
  for (ir::Value* v : {copied, reduced, scattered, rows, gathered, gathered0}) g.add_output(v);
  runtime::Executable exe(g);
  exe.run();
  for (std::int64_t i = 0; i < 12; ++i) ASSERT_EQ(exe.value(copied).at(i), value(r, i));
  for (std::int64_t i = 0; i < 6; ++i) {
    float sum = value(0, i);
    for (int q = 1; q < p; ++q) sum += value(q, i);
    ASSERT_EQ(exe.value(reduced).at(i), sum) << "tp_reduce " << i;
  }
  ASSERT_EQ(exe.value(scattered).shape(), (Shape{2, 3}));
  for (std::int64_t row = 0; row < 2; ++row)
    for (std::int64_t j = 0; j < 3; ++j)
      ASSERT_EQ(exe.value(scattered).at(row * 3 + j), value(r, row * 3 * p + 3 * r + j));
  ASSERT_EQ(exe.value(rows).shape(), (Shape{3, 2}));
  for (std::int64_t i = 0; i < 6; ++i) ASSERT_EQ(exe.value(rows).at(i), value(r, 6 * r + i));
  ASSERT_EQ(exe.value(gathered).shape(), (Shape{2, 3 * p}));
  for (std::int64_t row = 0; row < 2; ++row)
    for (int q = 0; q < p; ++q)
      for (std::int64_t j = 0; j < 3; ++j)
        ASSERT_EQ(exe.value(gathered).at(row * 3 * p + 3 * q + j), value(q, row * 3 + j));
  ASSERT_EQ(exe.value(gathered0).shape(), (Shape{3 * p, 4}));
  for (int q = 0; q < p; ++q)
    for (std::int64_t i = 0; i < 12; ++i)
      ASSERT_EQ(exe.value(gathered0).at(12 * q + i), value(q, i));
}

TEST(MpiTensorParallel, GradientsAreTheTransposedCollectives) {
  const int p = parallel::world().size();
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_copy(x, 0); }, "tp_copy");
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_reduce(x, 0); }, "tp_reduce");
  check_gradient(
      {2, 2 * p}, [](ir::Value* x) { return parallel::tp_scatter(x, -1, 0); }, "tp_scatter");
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_gather(x, 1, 0); }, "tp_gather");
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_gather(x, 0, 0); }, "tp_gather axis 0");
}

TEST(MpiTensorParallel, RefusesAFeatureDimensionThatDoesNotSplit) {
  const int p = parallel::world().size();
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 2 * p + 1});
  EXPECT_THAT([&] { parallel::tp_scatter(x, -1, 0); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                  "does not split into " + std::to_string(p) + " equal parts")));
}
