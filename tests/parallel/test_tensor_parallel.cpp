// Tensor parallelism in a single process (group 0 is the local communicator here, one shard):
// the four collective ops through the op harness (forward, finite-difference gradients, bad
// inputs), the rewrite of a model's Linear pairs, and pieces of tensors. The multi-rank
// behaviour is in mpi_test_tensor_parallel.cpp, whole runs in tests/examples/tensor_parallel.sh.
#include <gmock/gmock.h>

#include <algorithm>

#include "minidl/autograd/autograd.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/tensor_parallel.hpp"
#include "minidl/runtime/executable.hpp"
#include "ops/harness.hpp"

using namespace minidl;
using minidl::testing::BadCase;
using minidl::testing::OpCase;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

static const std::vector<OpCase> kCopy = {OpCase().shapes({{3, 4}})};
static const std::vector<BadCase> kCopyBad = {{{{3}}, {DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(tp_copy, kCopy, kCopyBad)

static const std::vector<OpCase> kReduce = {OpCase().shapes({{2, 5}})};
static const std::vector<BadCase> kReduceBad = {{{{3}}, {DType::I32}, {}, "expected f32 input"}};
MINIDL_OP_TEST(tp_reduce, kReduce, kReduceBad)

static const std::vector<OpCase> kScatter = {
    OpCase().shapes({{3, 4}}).attrs({{"ranks", 1}}),
    OpCase().shapes({{3, 4, 2}}).attrs({{"ranks", 1}, {"axis", 1}}),
};
static const std::vector<BadCase> kScatterBad = {
    {{{3, 5}}, {}, {{"ranks", 2}}, "dimension 1 of [3,5] (5) does not split into 2 equal parts"},
    {{{3, 4}}, {}, {{"ranks", 2}, {"axis", 2}}, "axis 2 is outside the input's 2 dimension(s)"},
    {{{3, 4}}, {}, {{"ranks", 0}}, "ranks must be at least 1, got 0"},
    {{{3}}, {DType::I32}, {{"ranks", 1}}, "expected f32 input"},
};
MINIDL_OP_TEST(tp_scatter, kScatter, kScatterBad)

static const std::vector<OpCase> kGather = {
    OpCase().shapes({{3, 4}}).attrs({{"ranks", 1}}),
    OpCase().shapes({{2, 3, 2}}).attrs({{"ranks", 1}, {"axis", 0}}),
};
static const std::vector<BadCase> kGatherBad = {
    {{{3, 4}}, {}, {{"ranks", 2}, {"axis", -3}}, "axis -3 is outside the input's 2 dimension(s)"},
    {{{3}}, {}, {}, "missing required attribute 'ranks'"},
};
MINIDL_OP_TEST(tp_gather, kGather, kGatherBad)

namespace {

// A 6 -> 8 -> 4 -> 3 MLP: one pair to split (fc1, fc2), fc3 left whole.
std::unique_ptr<nn::Sequential> mlp() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Linear>("fc1", 6, 8, nn::Init::He);
  m->emplace<nn::ReLU>("relu1");
  m->emplace<nn::Linear>("fc2", 8, 4, nn::Init::He);
  m->emplace<nn::ReLU>("relu2");
  m->emplace<nn::Linear>("fc3", 4, 3, nn::Init::Xavier);
  m->reset(7);
  return m;
}

}  // namespace

// The rewrite with one shard: the pair becomes tp_copy, the column and row products on slices
// of the parameters, tp_reduce and the second bias; the loss and every gradient (of the pieces,
// here the whole parameters) are those of the graph as the model built it.
TEST(TensorParallel, SplitsTheLinearPairAndKeepsTheResults) {
  parallel::register_ops();
  auto model = mlp();
  Tensor x = Tensor::empty({5, 6});
  for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.1f * (i % 7) - 0.3f;
  auto build = [&](bool split, std::vector<Tensor>* grads) {
    ir::Graph g;
    ir::Value* in = ops::parameter(g, "x", x);
    ir::Value* loss = ops::sum(ops::mul(model->forward(in), model->forward(in)));
    parallel::TensorParallelPlan plan;
    if (split) plan = parallel::split_matmul_pairs(g, {.shards = 1, .rank = 0, .group = 0});
    std::vector<ir::Value*> wrt;
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter" && n->name() != "x") wrt.push_back(plan.piece_of(n->output()));
    std::vector<ir::Value*> gr = autograd::differentiate(g, loss, wrt);
    g.add_output(loss);
    for (ir::Value* v : gr) g.add_output(v);
    if (split) {
      std::vector<std::string> ops;
      for (const ir::Node* n : g.nodes()) ops.push_back(n->op());
      // One pair per forward call; tp_reduce's gradient is a tp_copy (x itself needs none).
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "tp_copy"), 4);
      EXPECT_EQ(std::count(ops.begin(), ops.end(), "tp_reduce"), 2);
      // fc1.weight, fc1.bias, fc2.weight: one piece each, read by both pairs.
      EXPECT_EQ(plan.pieces.size(), 3u);
      EXPECT_EQ(plan.pairs, std::vector<std::string>(
                                {"fc1.matmul + fc2.matmul", "fc1.matmul.1 + fc2.matmul.1"}));
    }
    runtime::Executable exe(g);
    exe.run();
    for (ir::Value* v : gr) grads->push_back(exe.value(v).clone());
    return exe.value(loss).at(0);
  };
  std::vector<Tensor> whole, split;
  const float a = build(false, &whole), b = build(true, &split);
  EXPECT_EQ(a, b);
  ASSERT_EQ(whole.size(), split.size());
  for (std::size_t i = 0; i < whole.size(); ++i)
    for (std::int64_t j = 0; j < whole[i].numel(); ++j)
      ASSERT_EQ(whole[i].at(j), split[i].at(j)) << "gradient " << i << " element " << j;
}

TEST(TensorParallel, RefusesWhatItCannotSplit) {
  parallel::register_ops();
  auto model = mlp();
  {
    ir::Graph g;
    model->forward(ops::input(g, "x", {2, 6}));
    EXPECT_THAT([&] { parallel::split_matmul_pairs(g, {.shards = 3, .rank = 0, .group = 0}); },
                ThrowsMessage<Error>(HasSubstr("has 8 output features, which do not split into "
                                               "3 equal shards")));
  }
  nn::Sequential single;
  single.emplace<nn::Linear>("fc1", 6, 3, nn::Init::He);
  ir::Graph g;
  single.forward(ops::input(g, "x", {2, 6}));
  EXPECT_THAT([&] { parallel::split_matmul_pairs(g, {.shards = 2, .rank = 0, .group = 0}); },
              ThrowsMessage<Error>(HasSubstr("the model has no pair of Linear layers")));
}

// The split reads the parts each rank stores: a parameter stored whole cannot be split over
// more than one shard. A module stores a part of a parameter only where the part divides it.
TEST(TensorParallel, SplitsOnlyParametersStoredAsParts) {
  parallel::register_ops();
  auto model = mlp();
  {
    ir::Graph g;
    model->forward(ops::input(g, "x", {2, 6}));
    EXPECT_THAT([&] { parallel::split_matmul_pairs(g, {.shards = 2, .rank = 0, .group = 0}); },
                ThrowsMessage<Error>(HasSubstr("parameter 'fc1.weight' [8,6] is stored whole")));
    const auto split = parallel::plan_split(g, 2);
    ASSERT_EQ(split.size(), 3u);
    EXPECT_EQ(split[0].name, "fc1.weight");
    EXPECT_EQ(split[1].name, "fc1.bias");
    EXPECT_EQ(split[2].name, "fc2.weight");
    EXPECT_EQ(split[2].axis, 1);
  }
  EXPECT_THAT(
      [&] {
        model->shard_parameter("fc2.weight",
                               {.whole = {4, 8}, .axis = 1, .index = 0, .count = 3, .group = 0});
      },
      ThrowsMessage<Error>(HasSubstr("parameter 'fc2.weight' [4,8] cannot be stored as part 0 of "
                                     "3 of [4,8] along axis 1")));
  EXPECT_THAT(
      [&] {
        model->shard_parameter("fc9.weight",
                               {.whole = {4, 8}, .axis = 1, .index = 0, .count = 2, .group = 0});
      },
      ThrowsMessage<Error>(HasSubstr("has no parameter 'fc9.weight' to shard")));
  // Part 1 of 2 of fc2.weight's columns: the graph reads it whole through tp_gather.
  const Tensor before = model->parameters()[2].second.clone();
  model->shard_parameter("fc2.weight",
                         {.whole = {4, 8}, .axis = 1, .index = 1, .count = 2, .group = 0});
  const Tensor part = model->parameters()[2].second;
  ASSERT_EQ(part.shape(), (Shape{4, 4}));
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(part.at(i * 4 + j), before.at(i * 8 + 4 + j));
  ASSERT_EQ(model->parameter_shards().size(), 1u);
  EXPECT_THAT([&] { model->reset(1); },
              ThrowsMessage<Error>(HasSubstr("'fc2.weight' is stored as a shard")));
}

// Pieces of a [2, 6] tensor along its columns: shard 1 of 3 holds columns 2 and 3 of each row.
TEST(TensorParallel, TakesPiecesAlongOneAxis) {
  Tensor whole = Tensor::empty({2, 6});
  for (std::int64_t i = 0; i < 12; ++i) whole.data<float>()[i] = static_cast<float>(i);
  const Tensor p = parallel::take_piece(whole, {2, 2}, 1, 3);
  EXPECT_EQ(p.at(0), 2.0f);
  EXPECT_EQ(p.at(1), 3.0f);
  EXPECT_EQ(p.at(2), 8.0f);
  EXPECT_EQ(p.at(3), 9.0f);
  EXPECT_EQ(parallel::piece_axis({2, 6}, {2, 6}), -1);
  EXPECT_EQ(parallel::piece_axis({6, 2}, {3, 2}), 0);
  EXPECT_THAT(
      [] {
        parallel::piece_axis({2, 6}, {1, 3});
      },
      ThrowsMessage<Error>(HasSubstr("is not a piece of [2,6] along one dimension")));
  // One shard: its piece is the whole tensor.
  auto local = parallel::make_local_communicator();
  const Tensor back = parallel::gather_pieces(*local, whole, {2, 6});
  for (std::int64_t i = 0; i < 12; ++i) EXPECT_EQ(back.at(i), whole.at(i));
}
