// The tensor-parallel collective ops under mpirun (ctest runs 2 and 3 ranks), all ranks one
// replica's shards: each forward against the serial formula, and each gradient rule (the
// transposed collective) against central finite differences of the replica's loss (see
// Kind); a bad input is refused on every rank.
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

// The two kinds of op, as the shards use them. tp_copy and tp_scatter take a value every shard
// holds alike (a replica's activation) and give each shard its own; the replica's loss is the
// sum of the shards' parts. tp_reduce and tp_gather take each shard's own value and give every
// shard the same; the replica's loss is computed alike on every shard, and counts once.
enum class Kind { SharedInput, SharedOutput };

// y = op(x) for this rank's x; loss = sum(y * w), w a rank's own weights for a SharedInput op,
// the same on every rank for a SharedOutput one.
struct Case {
  ir::Graph g;
  Tensor x, w;
  ir::Value *y = nullptr, *loss = nullptr, *dx = nullptr;
  std::unique_ptr<runtime::Executable> exe;
  Case(const Shape& in, const Op& op, int xr, int wr) : x(filled(xr, in)) {
    ir::Value* xv = ops::parameter(g, "x", x);
    y = op(xv);
    w = Tensor::empty(y->shape());
    for (std::int64_t i = 0; i < w.numel(); ++i)
      w.data<float>()[i] = std::sin(1.0f + 0.7f * static_cast<float>(i) + 1.3f * wr);
    loss = ops::sum(ops::mul(y, ops::parameter(g, "w", w)));
    dx = autograd::differentiate(g, loss, {xv})[0];
    g.add_output(y);
    g.add_output(loss);
    g.add_output(dx);
    exe = std::make_unique<runtime::Executable>(g);
  }
  double run() {
    exe->run();
    return exe->value(loss).at(0);
  }
};

// The gradient rule against central differences of the replica's loss. SharedInput: element i
// of the shared x is perturbed on every rank at once, the loss summed over the ranks.
// SharedOutput: rank q's element i alone, the loss read on each rank (the same everywhere).
void check_gradient(const Shape& in, const Op& op, Kind kind, const char* what) {
  parallel::Communicator& comm = parallel::world();
  const int p = comm.size(), me = comm.rank();
  const bool shared_in = kind == Kind::SharedInput;
  Case c(in, op, shared_in ? 0 : me, shared_in ? me : 0);
  c.exe->run();
  const Tensor analytic = c.exe->value(c.dx).clone();
  auto loss = [&] {
    double l = c.run();
    if (shared_in) comm.allreduce_sum(&l, 1);
    return l;
  };
  const double h = 1e-2;
  for (int q = 0; q < (shared_in ? 1 : p); ++q) {
    const bool mine = shared_in || me == q;
    for (std::int64_t i = 0; i < c.x.numel(); ++i) {
      float* xi = c.x.data<float>() + i;
      const float keep = *xi;
      if (mine) *xi = keep + static_cast<float>(h);
      const double up = loss();
      if (mine) *xi = keep - static_cast<float>(h);
      const double down = loss();
      if (mine) *xi = keep;
      if (!mine) continue;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic.at(i), numeric, 1e-3 * (1 + std::abs(numeric)))
          << what << ": rank " << me << " element " << i;
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
  const Kind in = Kind::SharedInput, out = Kind::SharedOutput;
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_copy(x, 0); }, in, "tp_copy");
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_reduce(x, 0); }, out, "tp_reduce");
  check_gradient(
      {2, 2 * p}, [](ir::Value* x) { return parallel::tp_scatter(x, -1, 0); }, in, "tp_scatter");
  check_gradient(
      {2 * p, 3}, [](ir::Value* x) { return parallel::tp_scatter(x, 0, 0); }, in,
      "tp_scatter axis 0");
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_gather(x, 1, 0); }, out, "tp_gather");
  check_gradient(
      {2, 3}, [](ir::Value* x) { return parallel::tp_gather(x, 0, 0); }, out, "tp_gather axis 0");
}

TEST(MpiTensorParallel, RefusesAFeatureDimensionThatDoesNotSplit) {
  const int p = parallel::world().size();
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 2 * p + 1});
  EXPECT_THAT([&] { parallel::tp_scatter(x, -1, 0); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                  "does not split into " + std::to_string(p) + " equal parts")));
}
