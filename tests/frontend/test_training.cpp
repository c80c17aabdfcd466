// Short training runs on synthetic data: the loss falls and accuracy rises; modules name their
// parameters PyTorch's way; loading checks names and shapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "minidl/core/rng.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/frontend/trainer.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"

using namespace minidl;

using minidl::testing::blobs;

using minidl::testing::same_bits;

namespace {
std::unique_ptr<nn::Sequential> mlp() { return minidl::testing::small_mlp(); }

// Every parameter of `got` within rounding of `want`'s (the same names, in the same order).
void expect_same_parameters(const NamedTensors& want, const NamedTensors& got) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t p = 0; p < want.size(); ++p) {
    const Tensor& a = want[p].second;
    const Tensor& b = got[p].second;
    if (a.dtype() != DType::F32) {  // counters (BatchNorm's num_batches_tracked): exact
      ASSERT_TRUE(same_bits({want[p]}, {got[p]})) << want[p].first;
      continue;
    }
    for (std::int64_t i = 0; i < a.numel(); ++i)
      ASSERT_NEAR(b.at(i), a.at(i), 2e-4 + 2e-3 * std::abs(a.at(i)))
          << want[p].first << "[" << i << "]";
  }
}
}  // namespace

TEST(Training, LossFallsAndAccuracyRises) {
  Dataset train = blobs(2000, 11), test = blobs(500, 12);
  auto model = mlp();
  model->reset(42);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.5});
  Trainer t(*model, sgd, {.batch_size = 32, .eval_batch_size = 128, .seed = 3});
  const EvalStats before = t.evaluate(test);
  const EpochStats e1 = t.train_epoch(train, 1);
  EpochStats last = e1;
  for (int e = 2; e <= 4; ++e) last = t.train_epoch(train, e);
  const EvalStats after = t.evaluate(test);
  EXPECT_LT(last.loss, 0.5 * e1.loss);
  EXPECT_GT(last.accuracy, e1.accuracy);
  EXPECT_LT(after.loss, before.loss);
  EXPECT_GT(after.accuracy, 0.9);
  EXPECT_LT(before.accuracy, 0.3);
  EXPECT_EQ(after.samples, 500);
}

// 2000 samples at batch 32 end in a ragged batch of 16: it trains too, and the epoch sees
// every sample once.
TEST(Training, RaggedLastBatchAndThreadCountGiveTheSameModel) {
  Dataset train = blobs(2000, 5);
  auto run = [&](int threads) {
    const int saved = max_threads();
    set_num_threads(threads);
    auto model = mlp();
    model->reset(7);
    optim::Sgd sgd({.lr = 0.05});
    Trainer t(*model, sgd, {.batch_size = 32, .seed = 3});
    EXPECT_EQ(t.train_epoch(train, 1).samples, 2000);
    set_num_threads(saved);
    return model->parameters()[0].second.clone();
  };
  Tensor a = run(1), b = run(2);
  for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.at(i), b.at(i), 1e-5);
}

TEST(Modules, ParameterNamesFollowPyTorch) {
  auto model = mlp();
  auto params = model->parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].first, "fc1.weight");
  EXPECT_EQ(params[0].second.shape(), (Shape{32, 64}));
  EXPECT_EQ(params[1].first, "fc1.bias");
  EXPECT_EQ(params[3].first, "fc2.bias");
}

TEST(Modules, InitialisationDependsOnSeedOnly) {
  auto a = mlp(), b = mlp(), c = mlp();
  a->reset(1);
  b->reset(1);
  c->reset(2);
  const Tensor wa = a->parameters()[0].second;
  EXPECT_EQ(wa.at(5), b->parameters()[0].second.at(5));
  EXPECT_NE(wa.at(5), c->parameters()[0].second.at(5));
  double var = 0;
  for (std::int64_t i = 0; i < wa.numel(); ++i) var += double{wa.at(i)} * wa.at(i);
  EXPECT_NEAR(var / wa.numel(), 2.0 / 64.0, 0.01);  // He: variance 2 / fan_in
}

TEST(Modules, LoadStateDictSaysWhatDiffers) {
  auto model = mlp();
  NamedTensors values = model->parameters();
  values[1].second = Tensor::zeros({31});
  values.emplace_back("fc9.weight", Tensor::zeros({1}));
  values.erase(values.begin() + 2);
  try {
    nn::load_state_dict(*model, values, "ckpt.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("'ckpt.safetensors' does not match the model"));
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("'fc1.bias' is [31] f32 in the file, the model has [32] f32"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("missing 'fc2.weight'"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("unexpected 'fc9.weight'"));
  }
}

// Thread replicas train the same model as one graph at the same batch: 2 and 3 replicas (and a
// ragged last batch of 16 over 3 replicas), with momentum, both with and without fusion, agree
// with the single-graph run after a whole epoch; the CNN path too. The epoch's statistics agree.
TEST(Training, ThreadReplicasMatchOneGraph) {
  Dataset train = blobs(1000, 9);
  auto run = [&](int replicas, bool fuse, bool cnn, ir::Backend backend = ir::Backend::Native) {
    std::unique_ptr<nn::Sequential> model = mlp();
    if (cnn) {
      model = std::make_unique<nn::Sequential>();
      model->emplace<nn::Conv2d>("conv1", 1, 4, 3, 1, 1, nn::Init::He);
      model->emplace<nn::ReLU>("relu1");
      model->emplace<nn::MaxPool2d>("pool1", 2);
      model->emplace<nn::Flatten>("flatten");
      model->emplace<nn::Linear>("fc", 64, 10, nn::Init::Xavier);
    }
    model->reset(7);
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd,
              {.batch_size = 32,
               .seed = 3,
               .compile = {.backend = backend},
               .fuse = fuse,
               .replicas = replicas});
    const EpochStats s = t.train_epoch(train, 1);
    EXPECT_EQ(s.samples, 1000);
    return std::make_pair(s, model->parameters());
  };
  // Kernels of a parallel section run on one thread each, also when they were made while more
  // threads were available (oneDNN primitives plan their threads when they are created).
  const int threads = max_threads();
  set_num_threads(2);
  struct Case {
    int replicas;
    bool fuse;
    ir::Backend backend;
  };
  std::vector<Case> cases{{2, true, ir::Backend::Native},
                          {3, true, ir::Backend::Native},
                          {2, false, ir::Backend::Native}};
  if (MINIDL_WITH_ONEDNN) cases.push_back({2, true, ir::Backend::OneDnn});
  for (bool cnn : {false, true}) {
    const auto [want_stats, want] = run(1, true, cnn);
    for (const auto [replicas, fuse, backend] : cases) {
      SCOPED_TRACE(::testing::Message() << "cnn " << cnn << ", replicas " << replicas << ", fuse "
                                        << fuse << ", backend " << static_cast<int>(backend));
      const auto [stats, got] = run(replicas, fuse, cnn, backend);
      EXPECT_NEAR(stats.loss, want_stats.loss, 1e-4 * want_stats.loss);
      EXPECT_NEAR(stats.accuracy, want_stats.accuracy, 2.0 / 1000);
      ASSERT_NO_FATAL_FAILURE(expect_same_parameters(want, got));
    }
  }
  set_num_threads(threads);
}

// Plain SGD on one replica folds the weight updates into their gradient products
// (ops::FuseUpdateIntoProduct); thread replicas sum the gradients first and fold nothing. All
// train the same model up to rounding.
TEST(Training, FoldedUpdatesTrainTheSameModel) {
  Dataset train = blobs(1000, 9);
  const int threads = max_threads();
  set_num_threads(2);
  auto run = [&](int replicas, bool fuse) {
    auto model = mlp();
    model->reset(7);
    optim::Sgd sgd({.lr = 0.05});
    Trainer t(*model, sgd, {.batch_size = 32, .seed = 3, .fuse = fuse, .replicas = replicas});
    const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
    const auto folded = std::count_if(g.nodes().begin(), g.nodes().end(), [](const ir::Node* n) {
      return n->op() == "matmul_accumulate";
    });
    EXPECT_EQ(folded, fuse && replicas == 1 ? 2 : 0)
        << "replicas " << replicas << ", fuse " << fuse;
    t.train_epoch(train, 1);
    return model->parameters();
  };
  const NamedTensors want = run(1, false);
  for (const auto& [replicas, fuse] : {std::pair{1, true}, std::pair{2, true}}) {
    SCOPED_TRACE(::testing::Message() << "replicas " << replicas);
    ASSERT_NO_FATAL_FAILURE(expect_same_parameters(want, run(replicas, fuse)));
  }
  set_num_threads(threads);
}

namespace {
// One epoch of AdamW with clipping; the parameters and the optimizer's state afterwards.
NamedTensors train_accumulating(std::int64_t batch, std::int64_t accumulate,
                                std::int64_t micro_batch, int threads) {
  const int saved = max_threads();
  set_num_threads(threads);
  const Dataset train = blobs(1000, 9);  // 15 batches of 64 and a ragged one of 40
  auto model = mlp();
  model->reset(5);
  optim::AdamW adamw({.lr = 0.01, .weight_decay = 0.01});
  Trainer t(*model, adamw,
            {.batch_size = batch,
             .accumulate = accumulate,
             .seed = 3,
             .micro_batch = micro_batch,
             .clip_grad_norm = 0.5});
  const EpochStats e = t.train_epoch(train, 1);
  EXPECT_EQ(e.samples, 1000);
  EXPECT_FALSE(std::isnan(e.grad_norm));
  set_num_threads(saved);
  NamedTensors out;
  for (const auto& [name, p] : model->parameters()) out.emplace_back(name, p.clone());
  for (const auto& [name, s] : adamw.state()) out.emplace_back(name, s.clone());
  return out;
}

}  // namespace

// Deterministic mode: micro-steps are subtrees of the batch's reduction tree and their sums
// follow it, so accumulating gives the whole batch's bits, for any split and thread count.
TEST(Accumulation, DeterministicEqualsTheWholeBatchBitForBit) {
  const NamedTensors whole = train_accumulating(64, 1, 8, 1);
  EXPECT_TRUE(same_bits(whole, train_accumulating(16, 4, 8, 1)));
  EXPECT_TRUE(same_bits(whole, train_accumulating(8, 8, 8, 2)));
  EXPECT_TRUE(same_bits(whole, train_accumulating(32, 2, 8, 2)));
  // Not a power of two: micro-steps of unequal size, the same tree.
  EXPECT_TRUE(same_bits(train_accumulating(48, 1, 8, 2), train_accumulating(16, 3, 8, 1)));
}

// Other modes: the same model up to rounding (the sums' order differs).
TEST(Accumulation, EqualsTheWholeBatchUpToRounding) {
  const NamedTensors whole = train_accumulating(64, 1, 0, 2);
  const NamedTensors acc = train_accumulating(16, 4, 0, 2);
  expect_same_parameters(whole, acc);
}

namespace {
// 64 -> 32 -> BatchNorm1d -> relu -> 10 over [N,1,8,8].
std::unique_ptr<nn::Sequential> bn_mlp() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
  m->emplace<nn::BatchNorm1d>("bn1", 32);
  m->emplace<nn::ReLU>("act1");
  m->emplace<nn::Linear>("fc2", 32, 10, nn::Init::Xavier);
  m->reset(4);
  return m;
}

// One epoch of a BatchNorm model; its state_dict (parameters and running statistics) after.
NamedTensors train_bn(int replicas, bool sync) {
  const Dataset train = blobs(200, 21);  // 6 batches of 32 and one of 8
  auto model = bn_mlp();
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
  Trainer t(*model, sgd,
            {.batch_size = 32, .seed = 3, .replicas = replicas, .sync_batch_stats = sync});
  t.train_epoch(train, 1);
  NamedTensors out;
  for (const auto& [name, s] : model->state_dict()) out.emplace_back(name, s.clone());
  return out;
}
}  // namespace

// Thread replicas and BatchNorm: each replica normalises by its own share of the batch unless
// --sync-bn sums the statistics over the replicas first; the running statistics are the whole
// batch's either way, as one replica's.
TEST(Training, BatchNormStatisticsOverReplicas) {
  const int threads = max_threads();
  set_num_threads(2);
  const NamedTensors one = train_bn(1, false);
  // Synchronised: the model of one replica, up to rounding.
  expect_same_parameters(one, train_bn(2, true));
  expect_same_parameters(one, train_bn(3, true));
  EXPECT_TRUE(same_bits(one, train_bn(1, true)));  // nothing to sum over with one replica
  // Per replica: another model, but the running statistics after the first step are still the
  // whole batch's (checked by the module tests); here the trained weights differ.
  const NamedTensors local = train_bn(2, false);
  EXPECT_FALSE(same_bits(one, local));
  set_num_threads(threads);
}

// EpochStats::flops counts the products of the training steps the epoch ran, as the ops count
// them: small_mlp (64 -> 32 -> 10) computes fc1's forward and weight gradient (its input needs
// no gradient) and fc2's forward, weight and data gradients, 2 x 4096 + 3 x 640 FLOPs per
// sample, whatever the batches (three of 32 and a ragged one of 4 here), the fusion of the
// updates into the products, the thread replicas; evaluation counts nothing.
TEST(Training, EpochFlopsCountTheProductsOfEverySample) {
  constexpr double kPerSample = 2 * (2 * 64 * 32) + 3 * (2 * 32 * 10);
  Dataset train = blobs(100, 21), test = blobs(50, 22);
  for (const int replicas : {1, 2}) {
    for (const bool fuse : {true, false}) {
      auto model = mlp();
      model->reset(5);
      optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
      Trainer t(*model, sgd, {.batch_size = 32, .fuse = fuse, .replicas = replicas});
      const EpochStats e1 = t.train_epoch(train, 1);
      t.evaluate(test);
      const EpochStats e2 = t.train_epoch(train, 2);
      EXPECT_EQ(e1.flops, 100 * kPerSample) << replicas << " replicas, fuse " << fuse;
      EXPECT_EQ(e2.flops, 100 * kPerSample) << replicas << " replicas, fuse " << fuse;
    }
  }
}
