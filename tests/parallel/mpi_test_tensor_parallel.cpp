// The tensor-parallel collective ops under mpirun (ctest runs 2 and 3 ranks), all ranks one
// replica's shards: each forward against the serial formula, and each gradient rule (the
// transposed collective) against central finite differences of the replica's loss (see
// Kind); a bad input is refused on every rank.
#include <gmock/gmock.h>

#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>

#include "minidl/autograd/autograd.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/tensor_parallel.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/tensor_parallel.hpp"

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

namespace {

// A 6 -> 12 -> 4 -> 3 MLP (12 splits into 2, 3 and 4 shards): the pair fc1, fc2; fc3 whole.
std::unique_ptr<nn::Sequential> pair_mlp() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Linear>("fc1", 6, 12, nn::Init::He);
  m->emplace<nn::ReLU>("relu1");
  m->emplace<nn::Linear>("fc2", 12, 4, nn::Init::He);
  m->emplace<nn::ReLU>("relu2");
  m->emplace<nn::Linear>("fc3", 4, 3, nn::Init::Xavier);
  m->reset(11);
  return m;
}

const Tensor& tensor_of(const NamedTensors& ts, const std::string& name) {
  for (const auto& [n, t] : ts)
    if (n == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// loss = sum(model(x)^2) and its gradients with respect to the graph's parameters (by name).
struct Outcome {
  float loss = 0.0f;
  std::vector<Tensor> out;
  std::map<std::string, Tensor> grads;
};
Outcome run_model(nn::Module& model, const Tensor& x,
                  const parallel::TensorParallelOptions* split) {
  ir::Graph g;
  ir::Value* y = model.forward(ops::input(g, "x", x.shape()));
  ir::Value* loss = ops::sum(ops::mul(y, y));
  if (split != nullptr) parallel::split_matmul_pairs(g, *split);
  std::vector<ir::Value*> params;
  for (ir::Node* n : g.nodes())
    if (n->op() == "parameter") params.push_back(n->output());
  const std::vector<ir::Value*> grads = autograd::differentiate(g, loss, params);
  g.add_output(y);
  g.add_output(loss);
  for (ir::Value* v : grads) g.add_output(v);
  runtime::Executable exe(g);
  Tensor(exe.input("x")).copy_from(x);
  exe.run();
  Outcome r{exe.value(loss).at(0), {exe.value(y).clone()}, {}};
  for (std::size_t i = 0; i < params.size(); ++i)
    r.grads[params[i]->producer()->name()] = exe.value(grads[i]).clone();
  return r;
}

}  // namespace

// Each rank stores its parts of the pair's parameters only: a graph that does not split the
// layers reads them whole through tp_gather and computes what the whole model computes, bit
// for bit; the split graph differentiates the parts, whose gradients are this rank's rows and
// columns of the whole model's; gather_parameters, load_parameters and unshard_parameters move
// between parts and whole tensors.
TEST(MpiTensorParallel, ParametersStoredAsPartsOfTheWholeModel) {
  parallel::Communicator& comm = parallel::world();
  const int p = comm.size(), r = comm.rank();
  if (12 % p != 0) GTEST_SKIP() << "12 hidden features do not split into " << p;
  auto whole = pair_mlp();
  auto model = pair_mlp();
  train::shard_split_parameters(*model, Shape{6}, comm);
  const auto shards = model->parameter_shards();
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].first, "fc1.weight");
  EXPECT_EQ(shards[0].second.axis, 0);
  EXPECT_EQ(shards[1].first, "fc1.bias");
  EXPECT_EQ(shards[2].first, "fc2.weight");
  EXPECT_EQ(shards[2].second.axis, 1);
  const NamedTensors parts = model->parameters();
  const std::int64_t h = 12 / p;
  ASSERT_EQ(tensor_of(parts, "fc1.weight").shape(), (Shape{h, 6}));
  ASSERT_EQ(tensor_of(parts, "fc2.weight").shape(), (Shape{4, h}));
  ASSERT_EQ(tensor_of(parts, "fc3.weight").shape(), (Shape{3, 4}));
  for (std::int64_t i = 0; i < h * 6; ++i)
    ASSERT_EQ(tensor_of(parts, "fc1.weight").at(i),
              tensor_of(whole->parameters(), "fc1.weight").at(r * h * 6 + i));

  Tensor x = Tensor::empty({5, 6});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.1f * (i % 7) - 0.3f;
  // Unsplit: the gathered whole weights, the whole model's bits.
  const Outcome a = run_model(*whole, x, nullptr), b = run_model(*model, x, nullptr);
  ASSERT_EQ(a.loss, b.loss);
  for (std::int64_t i = 0; i < a.out[0].numel(); ++i) ASSERT_EQ(a.out[0].at(i), b.out[0].at(i));
  // Split: the parts are the graph's parameters; their gradients are the whole's parts.
  const parallel::TensorParallelOptions o{
      .shards = p, .rank = r, .group = parallel::register_group(&comm)};
  const Outcome c = run_model(*model, x, &o);
  EXPECT_NEAR(c.loss, a.loss, 1e-5 * std::abs(a.loss));
  ASSERT_EQ(c.grads.count("fc1.weight"), 1u);
  ASSERT_EQ(c.grads.at("fc1.weight").shape(), (Shape{h, 6}));
  ASSERT_EQ(c.grads.at("fc2.weight").shape(), (Shape{4, h}));
  const Tensor want1 = parallel::take_piece(a.grads.at("fc1.weight"), {h, 6}, r, p);
  const Tensor want2 = parallel::take_piece(a.grads.at("fc2.weight"), {4, h}, r, p);
  for (std::int64_t i = 0; i < want1.numel(); ++i)
    EXPECT_NEAR(c.grads.at("fc1.weight").at(i), want1.at(i), 1e-4 * (1 + std::abs(want1.at(i))));
  for (std::int64_t i = 0; i < want2.numel(); ++i)
    EXPECT_NEAR(c.grads.at("fc2.weight").at(i), want2.at(i), 1e-4 * (1 + std::abs(want2.at(i))));
  for (std::int64_t i = 0; i < 12; ++i)
    EXPECT_NEAR(c.grads.at("fc3.weight").at(i), a.grads.at("fc3.weight").at(i),
                1e-4 * (1 + std::abs(a.grads.at("fc3.weight").at(i))));

  // Whole tensors out and in.
  const NamedTensors gathered = train::gather_parameters(*model);
  const NamedTensors reference = whole->parameters();
  ASSERT_EQ(gathered.size(), reference.size());
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    ASSERT_EQ(gathered[i].second.shape(), reference[i].second.shape()) << gathered[i].first;
    for (std::int64_t j = 0; j < reference[i].second.numel(); ++j)
      ASSERT_EQ(gathered[i].second.at(j), reference[i].second.at(j)) << gathered[i].first;
  }
  NamedTensors changed;
  for (const auto& [name, t] : reference) {
    Tensor c2 = t.clone();
    for (std::int64_t j = 0; j < c2.numel(); ++j) c2.data<float>()[j] = 0.5f * j;
    changed.emplace_back(name, c2);
  }
  train::load_parameters(*model, changed);
  EXPECT_EQ(tensor_of(model->parameters(), "fc1.weight").at(0), 0.5f * (r * h * 6));
  EXPECT_EQ(tensor_of(model->parameters(), "fc2.weight").at(1), 0.5f * (r * h + 1));
  train::unshard_parameters(*model);
  EXPECT_TRUE(model->parameter_shards().empty());
  const NamedTensors back = model->parameters();
  for (std::size_t i = 0; i < back.size(); ++i)
    for (std::int64_t j = 0; j < back[i].second.numel(); ++j)
      ASSERT_EQ(back[i].second.at(j), changed[i].second.at(j)) << back[i].first;
}
