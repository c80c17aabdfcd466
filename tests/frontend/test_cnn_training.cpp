// A small CNN (conv -> ReLU -> max-pool -> linear) trains on synthetic 8x8 images: the loss
// falls clearly within a few dozen steps. Dropout adds its nodes and the "rng_key" input to
// training graphs only, and training with it is reproducible and independent of the threads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "minidl/core/threading.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/ops/ops.hpp"
#include "support/synthetic.hpp"

using namespace minidl;

using minidl::testing::blobs;

namespace {

/// [N,1,8,8] -> conv 4x3x3 pad 1 -> ReLU -> max-pool 2 -> [N,64] (-> dropout) -> linear 10.
std::unique_ptr<nn::Sequential> small_cnn(double dropout = 0.0) {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv", 1, 4, 3, 1, 1, nn::Init::He);
  m->emplace<nn::ReLU>("relu");
  m->emplace<nn::MaxPool2d>("pool", 2);
  m->emplace<nn::Flatten>("flatten");
  if (dropout > 0.0) m->emplace<nn::Dropout>("drop", dropout);
  m->emplace<nn::Linear>("fc", 64, 10, nn::Init::Xavier);
  return m;
}

int count_ops(const ir::Graph& g, const std::string& op) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(),
                                        [&](const ir::Node* n) { return n->op() == op; }));
}

}  // namespace

TEST(CnnTraining, LossFallsClearly) {
  const Dataset train = blobs(640, 21), test = blobs(256, 22);
  auto model = small_cnn();
  model->reset(5);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
  Trainer t(*model, sgd, {.batch_size = 32, .eval_batch_size = 128, .seed = 4});
  const EvalStats before = t.evaluate(test);
  const EpochStats e1 = t.train_epoch(train, 1);  // 20 steps
  const EpochStats e2 = t.train_epoch(train, 2);
  const EvalStats after = t.evaluate(test);
  EXPECT_GT(before.loss, 1.5);  // about ln 10 = 2.3 untrained
  EXPECT_LT(after.loss, 0.35 * before.loss);
  EXPECT_LT(e2.loss, e1.loss);
  EXPECT_GT(after.accuracy, 0.8);
  EXPECT_EQ(e1.samples, 640);
}

TEST(DropoutModule, OnlyTrainingGraphsHaveItAndTheKey) {
  auto model = small_cnn(0.5);
  model->reset(1);
  auto build = [&](bool training) {
    auto g = std::make_unique<ir::Graph>();
    model->train(training);
    ir::Value* x = ops::input(*g, "x", Shape{6, 1, 8, 8});
    g->add_output((*model)(x));
    return g;
  };
  const auto train = build(true);
  const auto eval = build(false);
  EXPECT_EQ(count_ops(*train, "dropout"), 1);
  const ir::Node* key = train->find(ir::Role::RngKey);
  ASSERT_NE(key, nullptr);
  EXPECT_EQ(key->op(), "input");
  EXPECT_EQ(key->output()->shape(), Shape{2});
  EXPECT_EQ(key->output()->dtype(), DType::I64);
  EXPECT_EQ(count_ops(*eval, "dropout"), 0);
  EXPECT_EQ(eval->find(ir::Role::RngKey), nullptr);
  EXPECT_FALSE(model->training());

  // Two Dropout modules share one key input and differ by their seed.
  nn::Sequential two;
  two.emplace<nn::Dropout>("a", 0.3);
  two.emplace<nn::Dropout>("b", 0.3);
  two.reset(9);
  ir::Graph g;
  two(ops::input(g, "x", Shape{4, 5}));
  std::vector<std::int64_t> seeds;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() != "dropout") continue;
    EXPECT_EQ(n->input(1), g.find(ir::Role::RngKey)->output());
    seeds.push_back(n->attrs().get<std::int64_t>("seed"));
  }
  ASSERT_EQ(seeds.size(), 2u);
  EXPECT_NE(seeds[0], seeds[1]);

  EXPECT_THROW(nn::Dropout(1.0), Error);
  EXPECT_THROW(nn::Dropout(-0.5), Error);
}

// The trainer writes the key before each step: training is reproducible, does not depend on
// the thread count, and differs from training without dropout.
TEST(DropoutModule, TrainingIsReproducibleAndThreadIndependent) {
  const Dataset train = blobs(640, 23), test = blobs(256, 24);
  auto run = [&](int threads, double p) {
    const int saved = max_threads();
    set_num_threads(threads);
    auto model = small_cnn(p);
    model->reset(3);
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd, {.batch_size = 32, .eval_batch_size = 64, .seed = 8});
    for (int epoch = 1; epoch <= 3; ++epoch) t.train_epoch(train, epoch);
    const EvalStats e = t.evaluate(test);
    set_num_threads(saved);
    return std::pair{model->parameters()[2].second.clone(), e};
  };
  const auto [a, ea] = run(1, 0.3);
  const auto [b, eb] = run(2, 0.3);
  const auto [c, ec] = run(1, 0.0);
  ASSERT_EQ(a.numel(), b.numel());
  for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.at(i), b.at(i), 1e-5) << i;
  double diff = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    diff = std::max(diff, double{std::abs(a.at(i) - c.at(i))});
  EXPECT_GT(diff, 1e-3) << "dropout changed nothing";
  EXPECT_GT(ea.accuracy, 0.7);  // it still learns; evaluation runs without dropout
}

// The trainer writes a new key (step) before every step: with a learning rate too small to
// change any parameter, the same batch gives another loss in each epoch with dropout, and the
// very same loss without it.
TEST(DropoutModule, TrainerFeedsANewKeyEachStep) {
  const Dataset one_batch = blobs(32, 25);
  auto losses = [&](double p) {
    auto model = small_cnn(p);
    model->reset(4);
    optim::Sgd sgd({.lr = 1e-30});
    Trainer t(*model, sgd, {.batch_size = 32, .seed = 1, .shuffle = false});
    std::vector<double> l;
    for (int epoch = 1; epoch <= 3; ++epoch) l.push_back(t.train_epoch(one_batch, epoch).loss);
    return l;
  };
  const std::vector<double> plain = losses(0.0);
  EXPECT_EQ(plain[0], plain[1]);
  EXPECT_EQ(plain[1], plain[2]);
  const std::vector<double> dropped = losses(0.5);
  EXPECT_NE(dropped[0], dropped[1]);
  EXPECT_NE(dropped[1], dropped[2]);
  EXPECT_NE(dropped[0], dropped[2]);
}
