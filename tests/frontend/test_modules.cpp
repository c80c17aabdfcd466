// Modules register what they hold under local names and the module tree derives the full
// names; bad names are refused, naming the module and the name. A residual block as
// docs/adding-a-layer.md writes it, and nn::Residual; nn::AdaptiveAvgPool2d. Buffers are saved,
// loaded and checkpointed but never trained. A loss refuses a model output it cannot serve.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/io/checkpoint.hpp"
#include "minidl/io/safetensors.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/predict.hpp"
#include "support/error_of.hpp"
#include "support/modules.hpp"
#include "support/same_bits.hpp"
#include "support/synthetic.hpp"
#include "support/temp_dir.hpp"

namespace minidl {
using minidl::testing::same_bits;

namespace {

using ::testing::ElementsAre;
using testing::error_of;
using ::testing::HasSubstr;

// ---- The residual block of docs/adding-a-layer.md ----------------------------------------------

using testing::ResidualBlock;
using testing::shifted_mlp;

/// [N,1,8,8] -> flatten -> residual block (64, hidden 32) -> linear 10.
std::unique_ptr<nn::Sequential> residual_mlp() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<ResidualBlock>("block1", 64, 32);
  m->emplace<nn::Linear>("head", 64, 10, nn::Init::Xavier);
  return m;
}

std::vector<std::string> names(const NamedTensors& tensors) {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors) out.push_back(name);
  return out;
}

NamedTensors clone(const NamedTensors& v) {
  NamedTensors out;
  for (const auto& [n, t] : v) out.emplace_back(n, t.clone());
  return out;
}

class ResidualBlockTest : public testing::TempDirTest {};

TEST_F(ResidualBlockTest, NamesTrainsSavesAndLoads) {
  auto model = residual_mlp();
  model->reset(42);
  const NamedTensors params = model->parameters();
  EXPECT_THAT(names(params),
              ElementsAre("block1.fc1.weight", "block1.fc1.bias", "block1.fc2.weight",
                          "block1.fc2.bias", "head.weight", "head.bias"));
  EXPECT_EQ(params[0].second.shape(), (Shape{32, 64}));
  EXPECT_EQ(params[2].second.shape(), (Shape{64, 32}));
  EXPECT_THAT(model->buffers(), ::testing::IsEmpty());

  // One training step (a batch of 32 samples of 32): every parameter moves.
  optim::Sgd sgd({.lr = 0.1});
  Trainer t(*model, sgd, {.batch_size = 32, .seed = 3});
  const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
  // The block's own nodes are named under it, its children's under theirs (the sum carries the
  // ReLU after it, ops::FuseBiasActivation).
  ASSERT_NE(g.find("block1.add+relu"), nullptr);
  EXPECT_EQ(g.find("block1.add+relu")->op(), "add");
  ASSERT_NE(g.find("block1.fc2.weight"), nullptr);
  EXPECT_EQ(g.find("block1.fc2.weight")->op(), "parameter");
  const NamedTensors before = clone(params);
  const EpochStats s = t.train_epoch(testing::blobs(32, 5), 1);
  EXPECT_EQ(s.samples, 32);
  EXPECT_TRUE(std::isfinite(s.loss));
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_NE(
        std::memcmp(params[i].second.raw(), before[i].second.raw(), params[i].second.nbytes()), 0)
        << params[i].first << " did not change";
  }

  // Saved and loaded into a fresh model: the same bits and the same evaluation.
  const std::string file = path("block.safetensors");
  nn::save_state_dict(*model, file);
  EXPECT_THAT(names(load_safetensors(file).tensors),
              ElementsAre("block1.fc1.weight", "block1.fc1.bias", "block1.fc2.weight",
                          "block1.fc2.bias", "head.weight", "head.bias"));
  auto loaded = residual_mlp();
  loaded->reset(7);
  nn::load_state_dict(*loaded, file);
  EXPECT_TRUE(same_bits(model->parameters(), loaded->parameters()));
  optim::Sgd unused({.lr = 0.1});
  Trainer u(*loaded, unused, {.seed = 3});
  const Dataset test = testing::blobs(100, 6);
  EXPECT_EQ(t.evaluate(test).loss, u.evaluate(test).loss);
}

// Children registered before their parent is placed are renamed with it, at any depth.
TEST(Modules, NestedContainersDeriveDottedPaths) {
  auto blocks = std::make_unique<nn::Sequential>();
  auto second = std::make_unique<ResidualBlock>(8, 4);
  ResidualBlock* inner = second.get();
  blocks->emplace<ResidualBlock>("", 8, 4);  // "0"
  blocks->add(std::move(second));            // "1"
  EXPECT_EQ(inner->name(), "1");
  nn::Sequential model;
  model.add(std::move(blocks), "blocks");
  EXPECT_EQ(inner->name(), "blocks.1");
  EXPECT_THAT(names(model.parameters()),
              ElementsAre("blocks.0.fc1.weight", "blocks.0.fc1.bias", "blocks.0.fc2.weight",
                          "blocks.0.fc2.bias", "blocks.1.fc1.weight", "blocks.1.fc1.bias",
                          "blocks.1.fc2.weight", "blocks.1.fc2.bias"));
}

// ---- nn::Residual ------------------------------------------------------------------------------

/// The block of docs/adding-a-layer.md made from nn::Residual: relu(fc2(relu(fc1(x))) + x).
std::unique_ptr<nn::Residual> residual_container(std::int64_t features, std::int64_t hidden) {
  auto block = std::make_unique<nn::Residual>();
  block->emplace<nn::Linear>("fc1", features, hidden);
  block->emplace<nn::ReLU>("relu1");
  block->emplace<nn::Linear>("fc2", hidden, features, nn::Init::Xavier);
  block->emplace_post<nn::ReLU>("relu");
  return block;
}

// The container computes what the hand-written block computes, under the same names (so from
// the same initial weights): the same bits after an epoch of training.
TEST(Residual, TrainsAsTheHandWrittenBlock) {
  auto hand = residual_mlp();
  auto made = std::make_unique<nn::Sequential>();
  made->emplace<nn::Flatten>("flatten");
  made->add(residual_container(64, 32), "block1");
  made->emplace<nn::Linear>("head", 64, 10, nn::Init::Xavier);
  EXPECT_EQ(names(made->state_dict()), names(hand->state_dict()));
  EXPECT_EQ(made->describe(),
            "Sequential(flatten: Flatten, block1: Residual(body: [fc1: Linear(64 -> 32, he), "
            "relu1: ReLU, fc2: Linear(32 -> 64, xavier)], shortcut: identity, post: [relu: "
            "ReLU]), head: Linear(64 -> 10, xavier))");
  const Dataset train = testing::blobs(96, 5);
  for (nn::Module* m : {hand.get(), made.get()}) {
    m->reset(42);
    optim::Sgd sgd({.lr = 0.1, .momentum = 0.9});
    Trainer t(*m, sgd, {.batch_size = 32, .seed = 3});
    t.train_epoch(train, 1);
  }
  EXPECT_TRUE(same_bits(made->state_dict(), hand->state_dict()));
}

/// conv 3x3 (stride) -> relu -> conv 3x3, plus a 1x1 convolution with the stride as the
/// shortcut when `project`, -> relu: ResNet's basic block without batch normalisation.
std::unique_ptr<nn::Residual> conv_block(std::int64_t in, std::int64_t out, std::int64_t stride,
                                         bool project) {
  auto block = std::make_unique<nn::Residual>();
  block->emplace<nn::Conv2d>("conv1", in, out, 3, stride, 1, nn::Init::He, false);
  block->emplace<nn::ReLU>("relu1");
  block->emplace<nn::Conv2d>("conv2", out, out, 3, 1, 1, nn::Init::He, false);
  if (project) {
    auto shortcut = std::make_unique<nn::Sequential>();
    shortcut->emplace<nn::Conv2d>("0", in, out, 1, stride, 0, nn::Init::He, false);
    block->set_shortcut(std::move(shortcut));
  }
  block->emplace_post<nn::ReLU>("relu");
  return block;
}

/// [N,1,8,8] -> conv 8 -> block (8) -> block (16, stride 2, projected) -> global average pool
/// -> flatten -> linear 10: a small ResNet.
std::unique_ptr<nn::Sequential> small_resnet() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv1", 1, 8, 3, 1, 1, nn::Init::He, false);
  m->emplace<nn::ReLU>("relu");
  auto layer = std::make_unique<nn::Sequential>();
  layer->add(conv_block(8, 8, 1, false));
  layer->add(conv_block(8, 16, 2, true));
  m->add(std::move(layer), "layer1");
  m->emplace<nn::AdaptiveAvgPool2d>("pool", 1);
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc", 16, 10, nn::Init::Xavier);
  return m;
}

// torchvision's names: the body's children and the shortcut under the block, the shortcut's
// layers under "shortcut"; nodes likewise.
TEST(Residual, NamesChildrenLikeTorchvisionAndTrains) {
  auto model = small_resnet();
  model->reset(42);
  EXPECT_THAT(names(model->parameters()),
              ElementsAre("conv1.weight", "layer1.0.conv1.weight", "layer1.0.conv2.weight",
                          "layer1.1.conv1.weight", "layer1.1.conv2.weight",
                          "layer1.1.shortcut.0.weight", "fc.weight", "fc.bias"));
  optim::Sgd sgd({.lr = 0.1, .momentum = 0.9});
  Trainer t(*model, sgd, {.batch_size = 32, .seed = 3});
  const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
  ASSERT_NE(g.find("layer1.1.add+relu"), nullptr);  // the sum with its ReLU fused
  EXPECT_EQ(g.find("layer1.1.add+relu")->output()->shape(), (Shape{32, 16, 4, 4}));
  ASSERT_NE(g.find("pool.avg_pool2d"), nullptr);
  EXPECT_EQ(g.find("pool.avg_pool2d")->output()->shape(), (Shape{32, 16, 1, 1}));
  const NamedTensors before = clone(model->parameters());
  const Dataset train = testing::blobs(256, 5), test = testing::blobs(200, 6);
  const double initial = t.evaluate(test).loss;
  for (int e = 1; e <= 3; ++e) t.train_epoch(train, e);
  const NamedTensors after = model->parameters();
  for (std::size_t i = 0; i < after.size(); ++i) {
    EXPECT_NE(std::memcmp(after[i].second.raw(), before[i].second.raw(), after[i].second.nbytes()),
              0)
        << after[i].first << " did not change";
  }
  // Global pooling makes the 8x8 patterns slow to learn: 2.40 -> 2.06 in three epochs.
  EXPECT_LT(t.evaluate(test).loss, 0.9 * initial);
}

// Gradients through the body, the shortcut and the sum, against central differences: a block
// without ReLUs (no kinks for the differences to cross) and loss sum(y * y).
TEST(Residual, GradientsMatchFiniteDifferences) {
  nn::Residual block;
  block.emplace<nn::Conv2d>("conv1", 2, 3, 3, 2, 1, nn::Init::He, false);
  block.emplace<nn::Conv2d>("conv2", 3, 3, 3, 1, 1, nn::Init::He, false);
  block.set_shortcut(std::make_unique<nn::Conv2d>(2, 3, 1, 2, 0, nn::Init::He, false));
  block.reset(7);
  Tensor xt = Tensor::empty({2, 2, 5, 5});
  CounterRng(9).fill_normal(xt, 0, 0.0f, 1.0f);
  ir::Graph g;
  ir::Value* x = ops::parameter(g, "x", xt);
  ir::Value* y = block.forward(x);
  ir::Value* loss = ops::sum(ops::mul(y, y));
  std::vector<Tensor> params{xt};
  std::vector<ir::Value*> wrt{x};
  for (const auto& [name, t] : block.parameters()) {
    params.push_back(t);
    wrt.push_back(g.find(name)->output());
  }
  EXPECT_EQ(params.size(), 4u);  // x, conv1, conv2, shortcut
  const std::vector<ir::Value*> grads = autograd::differentiate(g, loss, wrt);
  for (ir::Value* v : grads) g.add_output(v);
  g.add_output(loss);
  runtime::Executable exe(g);
  exe.run();
  std::vector<Tensor> analytic;
  for (ir::Value* v : grads) analytic.push_back(exe.value(v).clone());
  // The loss is quadratic, so central differences are exact for any step: a large one keeps
  // the f32 rounding of the loss out of the numeric gradient.
  const auto r = autograd::check_gradients(params, analytic,
                                           [&] {
                                             exe.run();
                                             return double{exe.value(loss).at(0)};
                                           },
                                           {.eps = 0.05, .max_elements = 16});
  EXPECT_TRUE(r.ok) << r.report;
}

TEST(Residual, RefusesAShortcutOfAnotherShapeAndASecondShortcut) {
  nn::Sequential model;
  model.add(conv_block(4, 8, 2, false), "block");
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", Shape{2, 4, 8, 8});
  EXPECT_EQ(error_of([&] { model.forward(x); }),
            "Residual 'block': the body gives [2,8,4,4] but the identity shortcut gives "
            "[2,4,8,8] for x=[2,4,8,8] (a body that changes the shape needs a shortcut)");
  auto block = conv_block(4, 8, 2, true);
  EXPECT_THAT(error_of([&] { block->set_shortcut(std::make_unique<nn::ReLU>(), "other"); }),
              HasSubstr(": cannot set the shortcut 'other': the block has one already"));
  // A shortcut is a child like any other: its name is checked.
  auto named = conv_block(4, 4, 1, false);
  EXPECT_THAT(error_of([&] { named->set_shortcut(std::make_unique<nn::ReLU>(), "conv1"); }),
              HasSubstr("cannot register module 'conv1': this module has a child of that name "
                        "already"));
}

// ---- nn::AdaptiveAvgPool2d ---------------------------------------------------------------------

TEST(AdaptiveAvgPool2d, AveragesEachWindowOfTheOutputSize) {
  Tensor x = Tensor::empty({2, 3, 4, 6});
  CounterRng(3).fill_normal(x, 0, 0.0f, 1.0f);
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    return static_cast<double>(x.at(((n * 3 + c) * 4 + h) * 6 + w));
  };
  for (const bool onednn : {false, true}) {
    if (onednn && !MINIDL_WITH_ONEDNN) continue;
    SCOPED_TRACE(onednn ? "onednn" : "native");
    runtime::CompileOptions options;
    options.backend = onednn ? ir::Backend::OneDnn : ir::Backend::Native;
    nn::AdaptiveAvgPool2d global;  // 1: the global average
    const Tensor y = train::predict(global, x, options);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
    for (std::int64_t p = 0; p < 6; ++p) {
      double sum = 0.0;
      for (std::int64_t i = 0; i < 24; ++i) sum += at(p / 3, p % 3, i / 6, i % 6);
      EXPECT_NEAR(y.at(p), sum / 24, 1e-5);
    }
    nn::AdaptiveAvgPool2d two_by_three(2, 3);  // windows of 2x2
    const Tensor z = train::predict(two_by_three, x, options);
    ASSERT_EQ(z.shape(), (Shape{2, 3, 2, 3}));
    for (std::int64_t i = 0; i < z.numel(); ++i) {
      const std::int64_t n = i / 18, c = i / 6 % 3, oh = i / 3 % 2, ow = i % 3;
      double sum = 0.0;
      for (std::int64_t h = 2 * oh; h < 2 * oh + 2; ++h)
        for (std::int64_t w = 2 * ow; w < 2 * ow + 2; ++w) sum += at(n, c, h, w);
      EXPECT_NEAR(z.at(i), sum / 4, 1e-5) << i;
    }
  }
  EXPECT_EQ(nn::AdaptiveAvgPool2d(1).describe(), "AdaptiveAvgPool2d(1x1)");
}

TEST(AdaptiveAvgPool2d, RefusesSizesItCannotPoolEvenly) {
  nn::Sequential model;
  model.emplace<nn::AdaptiveAvgPool2d>("pool", 2);
  ir::Graph g;
  EXPECT_EQ(error_of([&] {
              model.forward(ops::input(g, "x", Shape{1, 3, 5, 4}));
            }),
            "AdaptiveAvgPool2d(2x2) 'pool': input 5x4 is not a multiple of the output size 2x2 "
            "(windows of different sizes are not supported); x=[1,3,5,4]");
  EXPECT_EQ(error_of([&] {
              model.forward(ops::input(g, "y", Shape{3, 5, 4}));
            }),
            "AdaptiveAvgPool2d(2x2) 'pool': expected input [N,C,H,W], got [3,5,4]");
  EXPECT_EQ(error_of([] { nn::AdaptiveAvgPool2d(0); }),
            "AdaptiveAvgPool2d(0x0): the output size must be positive");
}

// ---- Names that are refused --------------------------------------------------------------------

/// A module whose registration the test drives from outside.
class Probe final : public nn::Module {
 public:
  using nn::Module::buffer_value;
  using nn::Module::parameter_value;
  using nn::Module::register_buffer;
  using nn::Module::register_module;
  using nn::Module::register_parameter;
  ir::Value* forward(ir::Value* x) override { return x; }
  std::string describe() const override { return "Probe"; }
};

TEST(Modules, BadNamesAreRefusedNamingTheModuleAndTheName) {
  const Tensor w = Tensor::zeros({2});
  struct Case {
    std::string what;
    std::function<void(Probe&)> act;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"empty", [&](Probe& p) { p.register_parameter("", w); },
       "Probe: cannot register parameter '': it is empty"},
      {"a dot", [&](Probe& p) { p.register_parameter("fc.weight", w); },
       "Probe: cannot register parameter 'fc.weight': it contains '.', which joins the segments "
       "of a full name (the module tree makes the dotted names: register a child module "
       "instead)"},
      // The names a hand-made join gives: "res." + "fc" and "res." + ".fc".
      {"a trailing dot", [&](Probe& p) { p.register_module("res.", std::make_unique<Probe>()); },
       "Probe: cannot register module 'res.': it contains '.'"},
      {"two dots",
       [&](Probe& p) { p.register_module("res..fc", std::make_unique<nn::Linear>(2, 2)); },
       "Probe: cannot register module 'res..fc': it contains '.'"},
      {"a space", [&](Probe& p) { p.register_buffer("running mean", w); },
       "Probe: cannot register buffer 'running mean': it contains ' ' at offset 7; a name holds "
       "letters, digits and '_'"},
      {"a duplicate parameter",
       [&](Probe& p) {
         p.register_parameter("weight", w);
         p.register_parameter("weight", w);
       },
       "Probe: cannot register parameter 'weight': this module has a parameter of that name "
       "already"},
      {"a buffer named as a parameter",
       [&](Probe& p) {
         p.register_parameter("scale", w);
         p.register_buffer("scale", w);
       },
       "Probe: cannot register buffer 'scale': this module has a parameter of that name already"},
      {"a child named as a buffer",
       [&](Probe& p) {
         p.register_buffer("fc", w);
         p.register_module("fc", std::make_unique<Probe>());
       },
       "Probe: cannot register module 'fc': this module has a buffer of that name already"},
      {"a null child", [&](Probe& p) { p.register_module("fc", std::unique_ptr<Probe>()); },
       "Probe: cannot register module 'fc': it is null"},
      {"no storage", [&](Probe& p) { p.register_parameter("weight", Tensor()); },
       "Probe: cannot register parameter 'weight': the tensor has no storage"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Probe p;
    EXPECT_THAT(error_of([&] { c.act(p); }), HasSubstr(c.message));
  }
}

TEST(Modules, ContainersNameThemselvesInErrors) {
  nn::Sequential model;
  auto f = std::make_unique<nn::Sequential>();
  nn::Sequential* features = f.get();
  model.add(std::move(f), "features");
  features->emplace<nn::Linear>("fc1", 4, 4);
  EXPECT_EQ(error_of([&] { features->emplace<nn::Linear>("fc1", 4, 4); }),
            "Sequential 'features': cannot register module 'fc1': this module has a child of "
            "that name already");
  // An unnamed child is called by its index, which a named one may have taken.
  features->emplace<nn::ReLU>("2");
  EXPECT_THAT(error_of([&] { features->add(std::make_unique<nn::ReLU>()); }),
              HasSubstr("Sequential 'features': cannot register module '2'"));
  EXPECT_THAT(error_of([&] { features->emplace<nn::ReLU>("fc1.act"); }),
              HasSubstr("Sequential 'features': cannot register module 'fc1.act': it contains "
                        "'.'"));
}

TEST(Modules, GraphNodesOfUnknownOrClashingNamesAreRefused) {
  Probe p;
  p.register_parameter("weight", Tensor::zeros({2}));
  p.register_parameter("x", Tensor::zeros({2}));
  ir::Graph g;
  ops::input(g, "x", Shape{2});
  EXPECT_EQ(error_of([&] { p.parameter_value(g, "wieght"); }),
            "Probe has no parameter 'wieght' (registered: 'weight', 'x')");
  EXPECT_EQ(error_of([&] { p.buffer_value(g, "weight"); }),
            "Probe has no buffer 'weight' (registered: none)");
  // The model's own parameter "x" would be renamed by the graph, away from its saved name.
  EXPECT_THAT(error_of([&] { p.parameter_value(g, "x"); }),
              HasSubstr("Probe: parameter 'x' cannot be a node of the graph, which has a node of "
                        "that name already (input"));
  // Asked twice, a parameter is the same node.
  EXPECT_EQ(p.parameter_value(g, "weight"), p.parameter_value(g, "weight"));
}

/// A model written without nn::Module, whose names are whatever it says.
class HandNamed final : public train::Model {
 public:
  HandNamed(NamedTensors params, NamedTensors buffers)
      : params_(std::move(params)), buffers_(std::move(buffers)) {}
  ir::Value* forward(ir::Value* x) override { return x; }
  NamedTensors parameters() override { return params_; }
  NamedTensors buffers() override { return buffers_; }
  void train(bool) override {}
  std::string describe() const override { return "HandNamed"; }

 private:
  NamedTensors params_, buffers_;
};

// What the user saved, and its relatives: the trainer refuses them before anything is
// trained or saved under them.
TEST(Modules, HandAssembledNamesAreRefusedByTheTrainer) {
  const Tensor w = Tensor::zeros({2});
  struct Case {
    std::string name;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"res..fcweight",
       "model HandNamed: parameter name 'res..fcweight' is not a dotted path of "
       "names: segment '' is wrong (it is empty)"},
      {"fc1.weight.",
       "parameter name 'fc1.weight.' is not a dotted path of names: segment '' "
       "is wrong (it is empty)"},
      {".weight", "parameter name '.weight' is not a dotted path of names: segment '' is wrong"},
      {"", "parameter name '' is not a dotted path of names"},
      {"fc1/weight",
       "parameter name 'fc1/weight' is not a dotted path of names: segment "
       "'fc1/weight' is wrong (it contains '/' at offset 3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    HandNamed model({{"fc0.weight", w}, {c.name, Tensor::zeros({2})}}, {});
    optim::Sgd sgd({.lr = 0.1});
    EXPECT_THAT(error_of([&] { Trainer t(model, sgd, {}); }), HasSubstr(c.message));
  }
  HandNamed twice({{"fc.weight", w}}, {{"fc.weight", w}});
  optim::Sgd sgd({.lr = 0.1});
  EXPECT_EQ(error_of([&] { Trainer t(twice, sgd, {}); }),
            "model HandNamed: two tensors are named 'fc.weight'");
  HandNamed tied({{"fc.weight", w}, {"out.weight", w}}, {});
  EXPECT_EQ(error_of([&] { Trainer t(tied, sgd, {}); }),
            "model HandNamed: parameter 'out.weight' is the tensor 'fc.weight' under another name");
  HandNamed bad_buffer({{"fc.weight", w}}, {{"bn..mean", Tensor::zeros({2})}});
  EXPECT_THAT(error_of([&] { train::check_names(bad_buffer); }),
              HasSubstr("buffer name 'bn..mean' is not a dotted path of names"));
}

// ---- Buffers -----------------------------------------------------------------------------------

TEST(Buffers, AreListedReadAndNeverTrained) {
  auto model = shifted_mlp();
  EXPECT_THAT(names(model->parameters()),
              ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"));
  EXPECT_THAT(names(model->buffers()), ElementsAre("shift.offset"));
  EXPECT_THAT(names(model->state_dict()),
              ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "shift.offset"));
  const Tensor offset = model->buffers()[0].second;
  const Tensor initial = offset.clone();

  optim::Sgd sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01});
  // Unfused, so that every update is a node of its own (not folded into its gradient product).
  Trainer t(*model, sgd, {.batch_size = 32, .seed = 3, .fuse = false});
  // The optimizer keeps state for the parameters alone.
  EXPECT_THAT(names(sgd.state()),
              ElementsAre("fc1.weight.momentum_buffer", "fc1.bias.momentum_buffer",
                          "fc2.weight.momentum_buffer", "fc2.bias.momentum_buffer"));
  // In the training graph the buffer is a source that only forward nodes read, and every
  // update writes a parameter.
  const ir::Graph& g = t.training_graph(Shape{1, 8, 8});
  const ir::Node* b = g.find("shift.offset");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->op(), "state");
  for (const ir::Node* user : b->output()->users())
    EXPECT_EQ(user->phase(), ir::Phase::Forward) << user->describe();
  int updates = 0;
  for (const ir::Node* n : g.nodes()) {
    if (!n->def().update_role()) continue;
    ++updates;
    EXPECT_EQ(n->input(n->def().update_role()->param)->producer()->op(), "parameter")
        << n->describe();
  }
  EXPECT_EQ(updates, 4);

  const Dataset train = testing::blobs(256, 8), test = testing::blobs(100, 9);
  t.train_epoch(train, 1);
  EXPECT_EQ(std::memcmp(offset.raw(), initial.raw(), offset.nbytes()), 0)
      << "training changed the buffer";
  // The compiled graphs read the buffer's storage: a change shows in the next evaluation.
  const double loss = t.evaluate(test).loss;
  for (std::int64_t i = 0; i < offset.numel(); ++i) offset.data<float>()[i] += 1.0f;
  EXPECT_NE(t.evaluate(test).loss, loss);
}

class BuffersFile : public testing::TempDirTest {};

// What --save writes and --init reads.
TEST_F(BuffersFile, SaveAndLoadCarryThem) {
  auto model = shifted_mlp();
  const std::string file = path("shifted.safetensors");
  nn::save_state_dict(*model, file);
  const SafetensorsFile f = load_safetensors(file);
  EXPECT_THAT(names(f.tensors),
              ElementsAre("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "shift.offset"));

  auto other = shifted_mlp(9);
  Tensor offset = other->buffers()[0].second;
  std::memset(offset.raw(), 0, offset.nbytes());
  nn::load_state_dict(*other, file);
  EXPECT_TRUE(same_bits(model->state_dict(), other->state_dict()));

  // A file of the parameters alone lacks the buffer.
  const std::string params_only = path("params.safetensors");
  save_safetensors(params_only, model->parameters());
  EXPECT_EQ(error_of([&] { nn::load_state_dict(*other, params_only); }),
            "'" + params_only + "' does not match the model; missing 'shift.offset' [32]");
}

/// The offset as a running statistic kept outside the graph: after every step it moves by a
/// function of the step.
void update_offset(nn::Module& model, const StepInfo& info) {
  Tensor offset = model.buffers()[0].second;
  for (std::int64_t i = 0; i < offset.numel(); ++i)
    offset.data<float>()[i] += 0.001f * static_cast<float>((info.step + i) % 7);
}

TEST_F(BuffersFile, CheckpointResumeRestoresThem) {
  const Dataset d = testing::blobs(200, 31);
  const TrainerOptions options{.batch_size = 32, .seed = 11};
  auto uninterrupted = shifted_mlp();
  {
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*uninterrupted, sgd, options);
    for (int e = 1; e <= 2; ++e)
      t.train_epoch(d, e, [&](const StepInfo& i) { update_offset(*uninterrupted, i); });
  }
  // Killed 3 steps into epoch 2, after the checkpoint.
  const std::string dir = path("ckpt");
  std::filesystem::create_directories(dir);
  {
    auto model = shifted_mlp();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd, options);
    try {
      for (int e = 1; e <= 2; ++e) {
        t.train_epoch(d, e, [&](const StepInfo& i) {
          update_offset(*model, i);
          if (i.step != 10) return;
          checkpoint::save(dir, t.position(), {model->parameters(), model->buffers(), sgd.state()},
                           {}, 1);
          throw Error("stop");
        });
      }
    } catch (const Error&) {
    }
  }
  const std::string file = checkpoint::resolve(dir);
  EXPECT_THAT(names(load_safetensors(file).tensors), ::testing::Contains("shift.offset"));
  for (const bool lose_buffer : {false, true}) {
    SCOPED_TRACE(lose_buffer ? "buffer lost" : "buffer restored");
    auto model = shifted_mlp(5);  // other parameters and offset, which the checkpoint replaces
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd, options);
    const checkpoint::Loaded ckpt =
        checkpoint::load(file, {model->parameters(), model->buffers(), sgd.state()});
    if (lose_buffer) {
      Tensor offset = model->buffers()[0].second;
      std::memset(offset.raw(), 0, offset.nbytes());
    }
    t.resume(ckpt.position);
    for (int e = ckpt.position.epoch; e <= 2; ++e)
      t.train_epoch(d, e, [&](const StepInfo& i) { update_offset(*model, i); });
    EXPECT_EQ(same_bits(uninterrupted->state_dict(), model->state_dict()), !lose_buffer);
  }
}

// Thread replicas and deterministic micro-shards share the buffer among replicas and reduce the
// parameters' gradients alone: they train the model the single graph trains.
TEST(Buffers, ReplicasAndMicroShardsReadTheSameBuffer) {
  const Dataset train = testing::blobs(256, 4);
  auto run = [&](int replicas, std::int64_t micro_batch) {
    auto model = shifted_mlp();
    const Tensor initial = model->buffers()[0].second.clone();
    optim::Sgd sgd({.lr = 0.05, .momentum = 0.9});
    Trainer t(*model, sgd,
              {.batch_size = 32, .seed = 3, .replicas = replicas, .micro_batch = micro_batch});
    t.train_epoch(train, 1);
    EXPECT_EQ(std::memcmp(model->buffers()[0].second.raw(), initial.raw(), initial.nbytes()), 0);
    return clone(model->parameters());
  };
  const NamedTensors want = run(1, 0);
  for (const auto& [replicas, micro_batch] : {std::pair{2, 0}, std::pair{1, 8}}) {
    SCOPED_TRACE(::testing::Message()
                 << "replicas " << replicas << ", micro-batch " << micro_batch);
    const NamedTensors got = run(replicas, micro_batch);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t p = 0; p < want.size(); ++p) {
      for (std::int64_t i = 0; i < want[p].second.numel(); ++i) {
        ASSERT_NEAR(got[p].second.at(i), want[p].second.at(i),
                    2e-4 + 2e-3 * std::abs(want[p].second.at(i)))
            << want[p].first << "[" << i << "]";
      }
    }
  }
}

// ---- A loss refuses an output it cannot serve --------------------------------------------------

TEST(Losses, ClassificationLossRefusesAnOutputThatIsNotLogits) {
  const Dataset d = testing::blobs(64, 1);
  auto one_output = std::make_unique<nn::Sequential>();
  one_output->emplace<nn::Flatten>("flatten");
  one_output->emplace<nn::Linear>("fc", 64, 1);
  auto images = std::make_unique<nn::Sequential>();
  images->emplace<nn::ReLU>("act");
  optim::Sgd sgd({.lr = 0.1});
  {
    Trainer t(*one_output, sgd, {.batch_size = 32});
    EXPECT_THAT(error_of([&] { t.train_epoch(d, 1); }),
                HasSubstr("loss cross-entropy needs the model's output as logits [N, classes] "
                          "with at least 2 classes, got [32,1]"));
  }
  {
    Trainer t(*images, sgd, {.batch_size = 32, .eval_batch_size = 50});
    EXPECT_THAT(error_of([&] { t.train_epoch(d, 1); }),
                HasSubstr("loss cross-entropy needs the model's output as logits [N, classes] "
                          "with at least 2 classes, got [32,1,8,8]"));
    EXPECT_THAT(error_of([&] { t.evaluate(d); }),
                HasSubstr("loss cross-entropy needs the model's output as logits [N, classes] "
                          "with at least 2 classes, got [50,1,8,8]"));
  }
}

TEST(Losses, TargetsTheDataCannotGiveAreRefused) {
  const Dataset d = testing::blobs(64, 1);
  const train::MeanSquaredError mse;
  optim::Sgd sgd({.lr = 0.1});
  auto model = testing::small_mlp();
  {
    Trainer t(*model, sgd, {.batch_size = 32, .loss = &mse});
    EXPECT_THAT(error_of([&] { t.train_epoch(d, 1); }),
                HasSubstr("loss 'mse' wants f32 targets [32,10] for 32 samples, but the targets "
                          "are the dataset's class labels (i32 [32]): use a classification loss, "
                          "or the samples themselves as targets"));
  }
  {
    Trainer t(*model, sgd,
              {.batch_size = 32, .loss = &mse, .targets = TrainerOptions::Targets::Inputs});
    EXPECT_THAT(error_of([&] { t.train_epoch(d, 1); }),
                HasSubstr("loss 'mse' wants f32 targets [32,10] for 32 samples, but the targets "
                          "are the samples themselves ([1,8,8] each): the model's output must "
                          "have as many values per sample"));
  }
}

}  // namespace
}  // namespace minidl
