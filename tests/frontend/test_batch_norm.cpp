// nn::BatchNorm1d / nn::BatchNorm2d: PyTorch's names, defaults and state_dict; the training
// graph normalises by the batch and updates the running statistics once per step (also with
// thread replicas, which build one forward per replica in the same graph); evaluation
// normalises by the running statistics; save and load keep num_batches_tracked (i64, shape []);
// the whole model's gradient through BatchNorm against finite differences.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/io/checkpoint.hpp"
#include "minidl/io/safetensors.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"
#include "support/modules.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"
#include "support/temp_dir.hpp"
#include "support/training_graph.hpp"

namespace minidl {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> names(const NamedTensors& tensors) {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors) out.push_back(name);
  return out;
}

/// conv 1 -> 8 -> BatchNorm2d -> relu -> pool -> flatten -> linear 10, over [N,1,8,8].
std::unique_ptr<nn::Sequential> bn_cnn(std::uint64_t seed = 5) {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv", 1, 8, 3, 1, 1, nn::Init::He);
  m->emplace<nn::BatchNorm2d>("bn", 8);
  m->emplace<nn::ReLU>("relu");
  m->emplace<nn::MaxPool2d>("pool", 4);
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc", 8 * 2 * 2, 10, nn::Init::Xavier);
  m->reset(seed);
  return m;
}

std::int64_t tracked(nn::Module& m, const std::string& name) {
  for (const auto& [n, t] : m.buffers())
    if (n == name) return *t.data<std::int64_t>();
  ADD_FAILURE() << "no buffer " << name;
  return -1;
}

int count_op(const ir::Graph& g, std::string_view op) {
  int k = 0;
  for (const ir::Node* n : g.nodes()) k += n->op() == op;
  return k;
}

}  // namespace

TEST(BatchNorm, NamesDefaultsAndDescription) {
  auto m = bn_cnn();
  EXPECT_THAT(
      names(m->state_dict()),
      ElementsAre("conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias",
                  "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"));
  const NamedTensors sd = m->state_dict();
  for (const auto& [name, t] : sd) {
    if (name.rfind("bn.", 0) != 0) continue;
    if (name == "bn.num_batches_tracked") {
      EXPECT_EQ(t.dtype(), DType::I64);
      EXPECT_EQ(t.shape(), Shape{});
      EXPECT_EQ(*t.data<std::int64_t>(), 0);
      continue;
    }
    EXPECT_EQ(t.shape(), Shape{8}) << name;
    const float want = name == "bn.weight" || name == "bn.running_var" ? 1.0f : 0.0f;
    for (std::int64_t i = 0; i < 8; ++i) EXPECT_EQ(t.at(i), want) << name;
  }
  EXPECT_EQ(nn::BatchNorm2d(16).describe(), "BatchNorm2d(16)");
  EXPECT_EQ(nn::BatchNorm1d(4, 1e-3, 0.2, false).describe(),
            "BatchNorm1d(4, eps=0.001, momentum=0.2, affine=False)");
  nn::BatchNorm1d plain(4, 1e-5, 0.1, false, false);
  EXPECT_THAT(plain.parameters(), IsEmpty());
  EXPECT_THAT(plain.buffers(), IsEmpty());
  EXPECT_THROW(nn::BatchNorm2d(0), Error);
  EXPECT_THROW(nn::BatchNorm2d(3, 1e-5, 1.5), Error);
}

TEST(BatchNorm, RefusesInputsOfTheWrongShape) {
  auto check = [](nn::Module& bn, const Shape& shape, const std::string& want) {
    ir::Graph g;
    try {
      bn(ops::input(g, "x", shape));
      ADD_FAILURE() << "accepted " << shape.str();
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(want));
    }
  };
  nn::BatchNorm2d bn2(3);
  nn::BatchNorm1d bn1(3);
  check(bn2, {2, 4, 5, 5}, "BatchNorm2d(3) '': expected input [N,3,H,W], got [2,4,5,5]");
  check(bn2, {2, 3}, "expected input [N,3,H,W], got [2,3]");
  check(bn1, {2, 3, 4, 5}, "BatchNorm1d(3) '': expected input [N,3] or [N,3,L], got [2,3,4,5]");
}

// Training: y has each channel's batch mean 0 and variance 1 (then weight and bias); the running
// statistics move by momentum towards the batch's mean and unbiased variance.
TEST(BatchNorm, TrainingNormalisesByTheBatchAndUpdatesTheRunningStatistics) {
  for (const Shape& shape : {Shape{6, 3, 4, 5}, Shape{10, 3}, Shape{4, 3, 7}}) {
    SCOPED_TRACE(shape.str());
    const bool two_d = shape.rank() == 4;
    std::unique_ptr<nn::BatchNorm> bn;
    if (two_d) {
      bn = std::make_unique<nn::BatchNorm2d>(3, 1e-5, 0.25);
    } else {
      bn = std::make_unique<nn::BatchNorm1d>(3, 1e-5, 0.25);
    }
    Tensor x = Tensor::empty(shape);
    CounterRng(2).fill_normal(x, 0, 1.0f, 3.0f);
    ir::Graph g;
    ir::Value* y = (*bn)(ops::parameter(g, "x", x));
    g.add_output(y);
    EXPECT_EQ(count_op(g, "bn_update_running"), 1);
    EXPECT_EQ(count_op(g, "cross_replica_sum"), 1);
    runtime::Executable exe(g);
    exe.run();
    const std::int64_t n = shape[0], ch = shape[1], sp = shape.numel() / (n * ch), m = n * sp;
    const NamedTensors buffers = bn->buffers();
    for (std::int64_t c = 0; c < ch; ++c) {
      double mx = 0, vx = 0, my = 0, vy = 0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s) {
          mx += x.at((i * ch + c) * sp + s);
          my += exe.value(y).at((i * ch + c) * sp + s);
        }
      mx /= m;
      my /= m;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s) {
          vx += std::pow(x.at((i * ch + c) * sp + s) - mx, 2);
          vy += std::pow(exe.value(y).at((i * ch + c) * sp + s) - my, 2);
        }
      EXPECT_NEAR(my, 0.0, 1e-5);
      EXPECT_NEAR(vy / m, 1.0, 1e-3);
      EXPECT_NEAR(buffers[0].second.at(c), 0.25 * mx, 1e-5);
      EXPECT_NEAR(buffers[1].second.at(c), 0.75 + 0.25 * vx / (m - 1), 1e-4);
    }
    EXPECT_EQ(*buffers[2].second.data<std::int64_t>(), 1);
  }
}

// Evaluation: the running statistics, no statistics of the batch and no update.
TEST(BatchNorm, EvaluationUsesTheRunningStatistics) {
  nn::BatchNorm2d bn(2, 1e-3);
  NamedTensors sd = bn.state_dict();  // weight, bias, running_mean, running_var, tracked
  const float w[] = {2.0f, -1.0f}, b[] = {0.5f, 1.0f}, rm[] = {1.0f, -2.0f}, rv[] = {4.0f, 0.25f};
  for (int c = 0; c < 2; ++c) {
    sd[0].second.data<float>()[c] = w[c];
    sd[1].second.data<float>()[c] = b[c];
    sd[2].second.data<float>()[c] = rm[c];
    sd[3].second.data<float>()[c] = rv[c];
  }
  bn.eval();
  Tensor x = Tensor::empty({3, 2, 2, 2});
  CounterRng(4).fill_normal(x, 0, 0.0f, 1.0f);
  ir::Graph g;
  ir::Value* y = bn(ops::parameter(g, "x", x));
  g.add_output(y);
  EXPECT_EQ(count_op(g, "bn_stats"), 0);
  EXPECT_EQ(count_op(g, "bn_update_running"), 0);
  runtime::Executable exe(g);
  exe.run();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const int c = static_cast<int>(i / 4 % 2);
    EXPECT_NEAR(exe.value(y).at(i), (x.at(i) - rm[c]) / std::sqrt(rv[c] + 1e-3) * w[c] + b[c],
                1e-5);
  }
  EXPECT_EQ(*sd[4].second.data<std::int64_t>(), 0);

  // Without running statistics, evaluation normalises by the batch, as PyTorch does.
  nn::BatchNorm2d batch_only(2, 1e-5, 0.1, true, false);
  batch_only.eval();
  ir::Graph h;
  batch_only(ops::parameter(h, "x", x));
  EXPECT_EQ(count_op(h, "bn_stats"), 1);
  EXPECT_EQ(count_op(h, "bn_update_running"), 0);
}

// One update per training graph and step, whatever the number of thread replicas (each builds
// its own forward in the graph); ragged last batches included.
TEST(BatchNorm, RunningStatisticsAreUpdatedOncePerStep) {
  const Dataset d = testing::blobs(200, 7);
  for (int replicas : {1, 2, 3}) {
    SCOPED_TRACE(replicas);
    auto model = bn_cnn();
    optim::Sgd sgd({.lr = 0.05});
    Trainer t(*model, sgd, {.batch_size = 32, .seed = 3, .replicas = replicas});
    const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
    EXPECT_EQ(count_op(g, "bn_update_running"), 1);
    // The replicas' sums of the statistics joined into one (parallel::ThreadReplicas).
    EXPECT_EQ(count_op(g, "cross_replica_sum"), 1);
    EXPECT_EQ(count_op(g, "bn_stats"), replicas);
    t.train_epoch(d, 1);
    EXPECT_EQ(tracked(*model, "bn.num_batches_tracked"), 7);  // 6 full batches and one of 8
    t.evaluate(d);
    EXPECT_EQ(tracked(*model, "bn.num_batches_tracked"), 7);
  }
}

class BatchNormFile : public testing::TempDirTest {};

TEST_F(BatchNormFile, SaveAndLoadKeepTheRunningStatistics) {
  const Dataset d = testing::blobs(64, 2);
  auto model = bn_cnn();
  optim::Sgd sgd({.lr = 0.05});
  Trainer t(*model, sgd, {.batch_size = 32, .seed = 3});
  t.train_epoch(d, 1);
  ASSERT_EQ(tracked(*model, "bn.num_batches_tracked"), 2);
  const std::string file = path("bn.safetensors");
  nn::save_state_dict(*model, file);
  const SafetensorsFile f = load_safetensors(file);
  for (const auto& [name, tensor] : f.tensors) {
    if (name != "bn.num_batches_tracked") continue;
    EXPECT_EQ(tensor.dtype(), DType::I64);
    EXPECT_EQ(tensor.shape(), Shape{});
    EXPECT_EQ(*tensor.data<std::int64_t>(), 2);
  }
  auto other = bn_cnn(9);
  nn::load_state_dict(*other, file);
  EXPECT_TRUE(testing::same_bits(model->state_dict(), other->state_dict()));

  // A checkpoint holds the buffers too, num_batches_tracked included.
  const std::string dir = path("ckpt");
  std::filesystem::create_directories(dir);
  const std::string saved = checkpoint::save(
      dir, t.position(), {model->parameters(), model->buffers(), sgd.state()}, {}, 1);
  auto resumed = bn_cnn(11);
  optim::Sgd sgd2({.lr = 0.05});
  Trainer t2(*resumed, sgd2, {.batch_size = 32, .seed = 3});
  checkpoint::load(saved, {resumed->parameters(), resumed->buffers(), sgd2.state()});
  EXPECT_TRUE(testing::same_bits(model->state_dict(), resumed->state_dict()));
  EXPECT_EQ(tracked(*resumed, "bn.num_batches_tracked"), 2);
}

// The gradient of a Conv -> BatchNorm -> ReLU -> Linear model's loss with respect to every
// parameter, through bn_moments_bwd and bn_stats_bwd, against central finite differences.
TEST(BatchNorm, ModelGradientMatchesFiniteDifferences) {
  const Dataset batch = testing::blobs(6, 3);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>("conv", 1, 4, 3, 2, 1, nn::Init::He);
  model->emplace<nn::BatchNorm2d>("bn", 4);
  model->emplace<nn::ReLU>("relu");
  model->emplace<nn::Flatten>("flatten");
  model->emplace<nn::Linear>("fc", 4 * 4 * 4, 10, nn::Init::Xavier);
  model->emplace<nn::BatchNorm1d>("bn_fc", 10);
  model->reset(3);
  // Weights away from 1 so that the affine path matters.
  for (auto& [name, t] : model->parameters())
    if (name == "bn.weight" || name == "bn_fc.weight") CounterRng(8).fill_uniform(t, 0, 0.5f, 1.5f);
  testing::TrainingGraph tg(*model, batch);
  runtime::Executable exe(tg.g);
  exe.run();
  // TrainingGraph's gradients are in graph order, which is the modules' registration order.
  std::vector<Tensor> params, analytic;
  for (auto& [name, t] : model->parameters()) params.push_back(t);
  for (ir::Value* v : tg.grads) analytic.push_back(exe.value(v).clone());
  ASSERT_EQ(params.size(), analytic.size());
  autograd::GradCheckOptions opt;
  opt.rtol = 2e-2;
  const auto r = autograd::check_gradients(
      params, analytic,
      [&] {
        exe.run();
        return static_cast<double>(exe.value(tg.loss).at(0));
      },
      opt);
  EXPECT_TRUE(r.ok) << r.report;
}

}  // namespace minidl

namespace minidl {

namespace {

// Two state dicts alike: the entries that are not f32 (counters) bit for bit, the f32 ones element
// by element within rel * (1 + |want|).
void expect_state_near(const NamedTensors& want, const NamedTensors& got, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t p = 0; p < want.size(); ++p) {
    if (want[p].second.dtype() != DType::F32) {
      EXPECT_TRUE(testing::same_bits(NamedTensors{want[p]}, NamedTensors{got[p]}));
      continue;
    }
    for (std::int64_t i = 0; i < want[p].second.numel(); ++i) {
      ASSERT_NEAR(got[p].second.at(i), want[p].second.at(i),
                  rel * (1 + std::fabs(want[p].second.at(i))))
          << want[p].first << "[" << i << "]";
    }
  }
}

}  // namespace

// The whole pipeline (fusion, thread replicas, layouts; fold-batch-norm in evaluation) on both
// backends: one epoch of the BatchNorm CNN gives the same parameters, running statistics and
// evaluation loss, up to rounding.
TEST(BatchNorm, TrainsAndEvaluatesAlikeOnBothBackends) {
  const Dataset d = testing::blobs(128, 12);
  auto run = [&](ir::Backend backend, int replicas) {
    auto model = bn_cnn();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    TrainerOptions o{.batch_size = 32, .seed = 3, .replicas = replicas};
    o.compile.backend = backend;
    Trainer t(*model, sgd, o);
    t.train_epoch(d, 1);
    const EvalStats e = t.evaluate(d);
    NamedTensors out;
    for (const auto& [name, tensor] : model->state_dict()) out.emplace_back(name, tensor.clone());
    return std::pair{out, e.loss};
  };
  const auto [want, want_loss] = run(ir::Backend::Native, 1);
  std::vector<std::pair<ir::Backend, int>> cases{{ir::Backend::Native, 2}};
#if MINIDL_WITH_ONEDNN
  cases.push_back({ir::Backend::OneDnn, 1});
  cases.push_back({ir::Backend::OneDnn, 2});
#endif
  for (const auto& [backend, replicas] : cases) {
    SCOPED_TRACE(fmt::format("{} replicas {}", ir::backend_name(backend), replicas));
    const auto [got, loss] = run(backend, replicas);
    // With 2 replicas each normalises by its own half of the batch (no --sync-bn), and the
    // running statistics are the first replica's until a pass sums them: compare loosely.
    const double tol = replicas == 1 ? 1e-3 : 0.3;
    EXPECT_NEAR(loss, want_loss, tol * (1 + std::fabs(want_loss)));
    if (replicas != 1) continue;
    expect_state_near(want, got, 1e-3);
  }
}

}  // namespace minidl

namespace minidl {

// ops::FuseBatchNormBackward in the training pipeline: every BatchNorm's input gradient becomes
// one batch_norm_bwd_data node and its reductions one batch_norm_bwd_reduce, per thread replica,
// with and without --sync-bn; the parameters and running statistics after an epoch are the
// unfused graph's up to rounding, on both backends.
TEST(BatchNorm, FusedBackwardTrainsAsTheUnfused) {
  const Dataset d = testing::blobs(128, 12);
  auto run = [&](ir::Backend backend, int replicas, bool sync, bool fuse) {
    auto model = bn_cnn();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    TrainerOptions o{.batch_size = 32, .seed = 3, .replicas = replicas};
    o.compile.backend = backend;
    o.sync_batch_stats = sync;
    o.fuse = fuse;
    Trainer t(*model, sgd, o);
    const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
    EXPECT_EQ(count_op(g, "batch_norm_bwd_data"), fuse ? replicas : 0);
    EXPECT_EQ(count_op(g, "batch_norm_bwd_reduce"), fuse ? replicas : 0);
    EXPECT_EQ(count_op(g, "batch_norm_bwd"), fuse ? 0 : replicas);
    EXPECT_EQ(count_op(g, "bn_stats_bwd"), fuse ? 0 : replicas);
    t.train_epoch(d, 1);
    NamedTensors out;
    for (const auto& [name, tensor] : model->state_dict()) out.emplace_back(name, tensor.clone());
    return out;
  };
  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  for (ir::Backend backend : backends) {
    for (int replicas : {1, 2}) {
      for (bool sync : {false, true}) {
        SCOPED_TRACE(
            fmt::format("{} replicas {} sync {}", ir::backend_name(backend), replicas, sync));
        const NamedTensors want = run(backend, replicas, sync, false);
        const NamedTensors got = run(backend, replicas, sync, true);
        expect_state_near(want, got, 1e-4);
      }
    }
  }
}

}  // namespace minidl

namespace minidl {

// The BatchNorm + ReLU and residual-sum + ReLU fusions in the training pipeline (small ResNet):
// no relu node is left and one relu_bwd per replica (the identity block's, holding its input's
// gradient sum), with and without thread replicas and --sync-bn; the evaluation graph folds the
// fused BatchNorm into its convolution. Against --no-fuse the parameters and running statistics
// after an epoch agree up to rounding (--no-fuse also runs oneDNN's BatchNorm backward); the
// exact comparison with the fusions toggled alone is tests/ops/test_fusion.cpp's.
TEST(BatchNorm, ReluFusionsTrainAsTheUnfused) {
  const Dataset d = testing::blobs(64, 12);
  auto run = [&](ir::Backend backend, int replicas, bool sync, bool fuse) {
    auto model = testing::small_resnet();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    TrainerOptions o{.batch_size = 16, .seed = 3, .replicas = replicas};
    o.compile.backend = backend;
    o.sync_batch_stats = sync;
    o.fuse = fuse;
    Trainer t(*model, sgd, o);
    const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
    EXPECT_EQ(count_op(g, "relu"), fuse ? 0 : 5 * replicas);
    EXPECT_EQ(count_op(g, "relu_bwd"), fuse ? replicas : 5 * replicas);
    t.train_epoch(d, 1);
    const EvalStats e = t.evaluate(d);
    EXPECT_TRUE(std::isfinite(e.loss));
    NamedTensors out;
    for (const auto& [name, tensor] : model->state_dict()) out.emplace_back(name, tensor.clone());
    return out;
  };
  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  for (ir::Backend backend : backends) {
    for (int replicas : {1, 2}) {
      for (bool sync : {false, true}) {
        SCOPED_TRACE(
            fmt::format("{} replicas {} sync {}", ir::backend_name(backend), replicas, sync));
        const NamedTensors want = run(backend, replicas, sync, false);
        const NamedTensors got = run(backend, replicas, sync, true);
        expect_state_near(want, got, 1e-4);
      }
    }
  }
}

}  // namespace minidl
