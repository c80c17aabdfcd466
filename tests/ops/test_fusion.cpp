// The fusion passes: which chains they fold, what they leave alone, and that a fused training
// graph computes the same loss and gradients (or, with updates folded, the same parameters) as
// the unfused one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "../support/modules.hpp"
#include "../support/synthetic.hpp"
#include "../support/training_graph.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/optimizer.hpp"

using namespace minidl;
using minidl::testing::SgdStep;
using minidl::testing::TrainingGraph;

namespace {

std::size_t count_op(const ir::Graph& g, std::string_view op) {
  return static_cast<std::size_t>(std::count_if(g.nodes().begin(), g.nodes().end(),
                                                [&](const ir::Node* n) { return n->op() == op; }));
}

}  // namespace

TEST(Fusion, FoldsBiasAndReluIntoMatmulAndKeepsResults) {
  const Dataset batch = minidl::testing::blobs(16, 3);
  auto model = minidl::testing::small_mlp();
  model->reset(7);
  TrainingGraph plain(*model, batch);
  TrainingGraph fused(*model, batch);
  ASSERT_TRUE(ops::FuseBiasActivation().run(fused.g));

  // fc1: matmul + bias_add + relu -> one node; fc2: matmul + bias_add -> one node. The backward
  // matmuls stay as they are (their outputs are not followed by bias_add or relu).
  EXPECT_EQ(count_op(plain.g, "bias_add"), 2u);
  EXPECT_EQ(count_op(fused.g, "bias_add"), 0u);
  EXPECT_EQ(count_op(fused.g, "relu"), 0u);
  EXPECT_EQ(count_op(fused.g, "relu_bwd"), 1u);  // reads the fused node's output
  EXPECT_EQ(count_op(fused.g, "matmul"), count_op(plain.g, "matmul"));
  const ir::Node* fc1 = fused.g.find("fc1.matmul+bias+relu");
  ASSERT_NE(fc1, nullptr) << ir::to_text(fused.g);
  EXPECT_EQ(fc1->attrs().get<std::string>("activation"), "relu");
  EXPECT_EQ(fc1->inputs().size(), 3u);
  ASSERT_NE(fused.g.find("fc2.matmul+bias"), nullptr) << ir::to_text(fused.g);
  EXPECT_NE(ir::to_text(fused.g).find("fused="), std::string::npos) << ir::to_text(fused.g);

  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  for (ir::Backend b : backends) {
    const auto want = plain.run(b);
    const auto got = fused.run(b);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      for (std::int64_t j = 0; j < want[i].numel(); ++j)
        ASSERT_NEAR(got[i].at(j), want[i].at(j), 1e-5f + 1e-4f * std::abs(want[i].at(j)))
            << "backend " << ir::backend_name(b) << ", output " << i << ", element " << j;
    }
  }
}

TEST(Fusion, LeavesSharedIntermediatesAlone) {
  Tensor at = Tensor::full({4, 3}, 0.5f), wt = Tensor::full({5, 3}, 0.25f);
  Tensor bt = Tensor::full({5}, -0.5f);
  ir::Graph g;
  ir::Value* a = ops::parameter(g, "a", at);
  ir::Value* w = ops::parameter(g, "w", wt);
  ir::Value* b = ops::parameter(g, "b", bt);
  ir::Value* y = ops::matmul(a, w, false, true);
  ir::Value* z = ops::bias_add(y, b);
  g.add_output(ops::relu(z));
  g.add_output(z);  // the pre-activation is read outside: only the bias may fold
  ASSERT_TRUE(ops::FuseBiasActivation().run(g));
  EXPECT_EQ(count_op(g, "relu"), 1u);
  EXPECT_EQ(count_op(g, "bias_add"), 0u);

  ir::Graph h;
  ir::Value* y2 = ops::matmul(ops::parameter(h, "a", at), ops::parameter(h, "w", wt), false, true);
  h.add_output(ops::bias_add(y2, ops::parameter(h, "b", bt)));
  h.add_output(y2);  // the product itself is read: nothing folds
  EXPECT_FALSE(ops::FuseBiasActivation().run(h));
  EXPECT_EQ(count_op(h, "bias_add"), 1u);
}

namespace {

/// Five steps of each graph leave the two models' parameters equal up to rounding.
void expect_same_training(SgdStep& plain, nn::Module& plain_model, SgdStep& fused,
                          nn::Module& fused_model) {
  runtime::Executable plain_exe(plain.g), fused_exe(fused.g);
  for (int step = 0; step < 5; ++step) {
    plain_exe.run();
    fused_exe.run();
  }
  const NamedTensors want = plain_model.parameters(), got = fused_model.parameters();
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t p = 0; p < want.size(); ++p) {
    for (std::int64_t i = 0; i < want[p].second.numel(); ++i) {
      const float w = want[p].second.at(i);
      ASSERT_NEAR(got[p].second.at(i), w, 1e-6f + 1e-5f * std::abs(w)) << want[p].first << i;
    }
  }
}

}  // namespace

TEST(Fusion, FoldsPlainSgdIntoTheWeightGradientProduct) {
  const Dataset batch = minidl::testing::blobs(16, 3);
  auto plain_model = minidl::testing::small_mlp();
  auto fused_model = minidl::testing::small_mlp();
  plain_model->reset(7);
  fused_model->reset(7);
  SgdStep plain(*plain_model, batch), fused(*fused_model, batch);
  ASSERT_TRUE(ops::FuseUpdateIntoProduct().run(fused.g));

  // Both weights' updates take their gradient products; the biases' (from bias_add_bwd) and
  // the data gradient's matmul stay.
  EXPECT_EQ(count_op(fused.g, "matmul_accumulate"), 2u) << ir::to_text(fused.g);
  EXPECT_EQ(count_op(fused.g, "sgd"), 2u);
  EXPECT_EQ(count_op(fused.g, "matmul"), count_op(plain.g, "matmul") - 2);
  const ir::Node* fc1 = fused.g.find("fc1.matmul.bwd+sgd");
  ASSERT_NE(fc1, nullptr) << ir::to_text(fused.g);
  // alpha -1 times the learning-rate input, read each step: a schedule still applies.
  EXPECT_FLOAT_EQ(fc1->attrs().get<float>("alpha"), -1.0f);
  EXPECT_EQ(fc1->input(3)->producer()->name(), "lr");
  EXPECT_EQ(fc1->phase(), ir::Phase::Update);
  EXPECT_EQ(std::get<std::string>(*fc1->annotations().find("fused")), "fc1.weight.sgd");

  expect_same_training(plain, *plain_model, fused, *fused_model);
}

TEST(Fusion, FoldsSgdMomentumIntoTheWeightGradientProduct) {
  // Nesterov momentum with weight decay: each weight's gradient product and update become one
  // matmul_sgd_momentum reading the velocity state; five steps train the same model.
  const Dataset batch = minidl::testing::blobs(16, 3);
  auto plain_model = minidl::testing::small_mlp();
  auto fused_model = minidl::testing::small_mlp();
  plain_model->reset(7);
  fused_model->reset(7);
  SgdStep plain(*plain_model, batch, 0.01, 0.9), fused(*fused_model, batch, 0.01, 0.9);
  ASSERT_TRUE(ops::FuseUpdateIntoProduct().run(fused.g));
  EXPECT_EQ(count_op(fused.g, "matmul_sgd_momentum"), 2u) << ir::to_text(fused.g);
  EXPECT_EQ(count_op(fused.g, "sgd_momentum"), 2u);
  EXPECT_EQ(count_op(fused.g, "matmul"), count_op(plain.g, "matmul") - 2);
  const ir::Node* fc1 = fused.g.find("fc1.matmul.bwd+sgd");
  ASSERT_NE(fc1, nullptr) << ir::to_text(fused.g);
  EXPECT_TRUE(fc1->attrs().get<bool>("nesterov"));
  EXPECT_FLOAT_EQ(fc1->attrs().get<float>("weight_decay"), 0.01f);
  EXPECT_EQ(fc1->input(3)->producer()->op(), "state");
  EXPECT_EQ(fc1->input(4)->producer()->name(), "lr");
  EXPECT_EQ(fc1->phase(), ir::Phase::Update);

  expect_same_training(plain, *plain_model, fused, *fused_model);
}

TEST(Fusion, LeavesUpdatesWithWeightDecayAlone) {
  const Dataset batch = minidl::testing::blobs(16, 3);
  auto model = minidl::testing::small_mlp();
  model->reset(7);
  SgdStep step(*model, batch, /*weight_decay=*/0.01);
  EXPECT_FALSE(ops::FuseUpdateIntoProduct().run(step.g));
  EXPECT_EQ(count_op(step.g, "matmul_accumulate"), 0u);
}

TEST(Fusion, LeavesReadGradientsAndSelfReadingProductsAlone) {
  // The gradient is also a graph output (a user reads it): it must still be stored.
  Tensor at = Tensor::full({4, 3}, 0.5f), dyt = Tensor::full({4, 5}, 0.25f);
  Tensor wt = Tensor::full({5, 3}, 1.0f);
  ir::Graph g;
  ir::Value* grad =
      ops::matmul(ops::parameter(g, "dy", dyt), ops::parameter(g, "a", at), true, false);
  ir::Value* lr = ops::parameter(g, "lr", Tensor::full({}, 0.1f));
  g.add_node(ops::op("sgd"), {ops::parameter(g, "w", wt), grad, lr});
  g.add_output(grad);
  EXPECT_FALSE(ops::FuseUpdateIntoProduct().run(g));
  EXPECT_EQ(count_op(g, "sgd"), 1u);

  // A product that reads the parameter itself: the GEMM would overwrite an operand it reads.
  ir::Graph h;
  ir::Value* w = ops::parameter(h, "w", Tensor::full({3, 3}, 1.0f));
  ir::Value* own = ops::matmul(w, ops::parameter(h, "s", Tensor::full({3, 3}, 0.5f)));
  h.add_node(ops::op("sgd"), {w, own, ops::parameter(h, "lr", Tensor::full({}, 0.1f))});
  EXPECT_FALSE(ops::FuseUpdateIntoProduct().run(h));
  EXPECT_EQ(count_op(h, "sgd"), 1u);
}

// Evaluation: conv (+bias) -> BatchNorm -> relu becomes one convolution on weights folded by a
// fold_batch_norm node, with the same outputs; a conv without bias and a BatchNorm without
// affine transform fold too. Training graphs (batch statistics) do not match.
TEST(Fusion, FoldsEvaluationBatchNormIntoTheConvolution) {
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>("conv1", 3, 8, 3, 1, 1, nn::Init::He);
  model->emplace<nn::BatchNorm2d>("bn1", 8);
  model->emplace<nn::ReLU>("relu1");
  model->emplace<nn::Conv2d>("conv2", 8, 4, 3, 1, 1, nn::Init::He, false);
  model->emplace<nn::BatchNorm2d>("bn2", 4, 1e-3, 0.1, false);
  model->reset(3);
  const CounterRng rng(6);
  std::uint64_t stream = 0;
  for (auto& [name, t] : model->state_dict()) {
    if (t.dtype() != DType::F32) continue;
    if (name.find("running_var") != std::string::npos || name.find("bn1.weight") == 0) {
      rng.fill_uniform(t, stream++, 0.5f, 2.0f);
    } else if (name.find("bn") == 0) {
      rng.fill_uniform(t, stream++, -1.0f, 1.0f);
    }
  }
  model->eval();
  Tensor x = Tensor::empty({2, 3, 6, 6});
  rng.fill_normal(x, 99, 0.0f, 1.0f);
  auto build = [&](ir::Graph& g) {
    ir::Value* y = model->forward(ops::parameter(g, "x", x));
    g.add_output(y);
    ops::FuseBiasActivation().run(g);
    return y;
  };
  ir::Graph plain, folded;
  ir::Value* want_v = build(plain);
  build(folded);
  ASSERT_TRUE(ops::FoldBatchNorm().run(folded));
  EXPECT_EQ(count_op(folded, "batch_norm"), 0u) << ir::to_text(folded);
  EXPECT_EQ(count_op(folded, "fold_batch_norm"), 2u);
  EXPECT_EQ(count_op(folded, "relu"), 0u);  // folded into conv1 as its activation
  EXPECT_EQ(
      folded.find("conv1.conv2d+bias+batch_norm+relu")->attrs().get<std::string>("activation"),
      "relu");
  runtime::Executable a(plain), b(folded);
  a.run();
  b.run();
  const Tensor& want = a.value(want_v);
  const Tensor& got = b.value(folded.outputs()[0]);
  for (std::int64_t i = 0; i < want.numel(); ++i)
    EXPECT_NEAR(got.at(i), want.at(i), 1e-4 * (1 + std::fabs(want.at(i)))) << i;

  model->train();
  ir::Graph training;
  build(training);
  EXPECT_FALSE(ops::FoldBatchNorm().run(training));
}

// add(bn_stats_bwd, batch_norm_bwd.dx), the operand order autograd does not build, fuses too;
// a dx that is also a graph output, or two backward ops of different x, do not.
TEST(Fusion, FusesBatchNormBackwardInEitherOrderOnly) {
  const Shape shape{4, 3, 5, 5};
  const CounterRng rng(11);
  Tensor x = Tensor::empty(shape), x2 = Tensor::empty(shape), dy = Tensor::empty(shape);
  Tensor w = Tensor::empty({3}), dstats = Tensor::empty({3, 3});
  rng.fill_normal(x, 0, 0.5f, 2.0f);
  rng.fill_normal(x2, 1, 0.0f, 1.0f);
  rng.fill_normal(dy, 2, 0.0f, 1.0f);
  rng.fill_uniform(w, 3, 0.5f, 1.5f);
  rng.fill_uniform(dstats, 4, -1.0f, 1.0f);
  enum class Variant { Reversed, DxIsOutput, OtherX };
  auto build = [&](ir::Graph& g, Variant v) {
    ir::Value* xv = ops::parameter(g, "x", x);
    auto [mean, var] = ops::bn_moments(ops::bn_stats(xv));
    ir::Value* wv = ops::parameter(g, "w", w);
    ir::Node* bwd = g.add_node(ops::op("batch_norm_bwd"),
                               {ops::parameter(g, "dy", dy), xv, mean, var, wv}, {}, "bwd");
    ir::Value* sx = v == Variant::OtherX ? ops::parameter(g, "x2", x2) : xv;
    ir::Value* sdx =
        g.add_node(ops::op("bn_stats_bwd"), {sx, ops::parameter(g, "ds", dstats)})->output();
    g.add_output(ops::add(sdx, bwd->output(0)));
    for (int o = 1; o < 5; ++o) g.add_output(bwd->output(o));
    if (v == Variant::DxIsOutput) g.add_output(bwd->output(0));
  };
  ir::Graph plain, fused;
  build(plain, Variant::Reversed);
  build(fused, Variant::Reversed);
  ASSERT_TRUE(ops::FuseBatchNormBackward().run(fused));
  EXPECT_EQ(count_op(fused, "add"), 0u) << ir::to_text(fused);
  EXPECT_EQ(count_op(fused, "batch_norm_bwd"), 0u);
  EXPECT_EQ(count_op(fused, "bn_stats_bwd"), 0u);
  EXPECT_EQ(count_op(fused, "batch_norm_bwd_data"), 1u);
  EXPECT_EQ(count_op(fused, "batch_norm_bwd_reduce"), 1u);
  EXPECT_FALSE(ops::FuseBatchNormBackward(false).run(plain));
  runtime::Executable a(plain), b(fused);
  a.run();
  b.run();
  for (std::size_t k = 0; k < plain.outputs().size(); ++k) {
    const Tensor& want = a.value(plain.outputs()[k]);
    const Tensor& got = b.value(fused.outputs()[k]);
    for (std::int64_t i = 0; i < want.numel(); ++i)
      ASSERT_NEAR(got.at(i), want.at(i), 1e-5 * (1 + std::fabs(want.at(i))))
          << "output " << k << " element " << i;
  }
  for (Variant v : {Variant::DxIsOutput, Variant::OtherX}) {
    ir::Graph g;
    build(g, v);
    EXPECT_FALSE(ops::FuseBatchNormBackward().run(g)) << ir::to_text(g);
  }
}

// A CNN's training graph: each convolution's bias gradient joins its weight gradient (one
// conv2d_bwd_weights_bias per convolution with a bias, none left for the convolution without),
// the linear layer's bias_add_bwd stays, and the loss and every gradient stay what the unfused
// graph computes, on every backend. Disabled (--no-fuse), the pass changes nothing.
TEST(Fusion, FoldsTheConvolutionBiasGradientIntoTheWeightGradient) {
  auto make = [] {
    auto m = std::make_unique<nn::Sequential>();
    m->emplace<nn::Conv2d>("conv1", 1, 4, 3, 1, 1, nn::Init::He);
    m->emplace<nn::ReLU>("relu1");
    m->emplace<nn::Conv2d>("conv2", 4, 16, 3, 1, 0, nn::Init::He);
    m->emplace<nn::ReLU>("relu2");
    m->emplace<nn::Conv2d>("conv3", 16, 4, 1, 1, 0, nn::Init::He, false);
    m->emplace<nn::Flatten>("flatten");
    m->emplace<nn::Linear>("fc", 4 * 6 * 6, 10, nn::Init::Xavier);
    m->reset(5);
    return m;
  };
  const Dataset batch = minidl::testing::blobs(6, 3);
  auto model = make();
  TrainingGraph plain(*model, batch), fused(*model, batch);
  EXPECT_FALSE(ops::FuseBiasIntoWeightGradient(false).run(plain.g));
  ASSERT_TRUE(ops::FuseBiasIntoWeightGradient().run(fused.g));
  EXPECT_EQ(count_op(plain.g, "bias_add_bwd"), 3u);
  EXPECT_EQ(count_op(fused.g, "bias_add_bwd"), 1u) << ir::to_text(fused.g);  // the linear layer's
  EXPECT_EQ(count_op(fused.g, "conv2d_bwd_weights_bias"), 2u);
  EXPECT_EQ(count_op(fused.g, "conv2d_bwd_weights"), 1u);  // conv3 has no bias
  const ir::Node* conv2 = nullptr;
  for (const ir::Node* n : fused.g.nodes())
    if (n->op() == "conv2d_bwd_weights_bias" && n->name().rfind("conv2.", 0) == 0) conv2 = n;
  ASSERT_NE(conv2, nullptr) << ir::to_text(fused.g);
  EXPECT_EQ(conv2->phase(), ir::Phase::Backward);
  ASSERT_NE(conv2->annotations().find("fused"), nullptr);
  EXPECT_NE(std::get<std::string>(*conv2->annotations().find("fused")).find("bias_add"),
            std::string::npos);

  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  for (ir::Backend b : backends) {
    const auto want = plain.run(b);
    const auto got = fused.run(b);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      for (std::int64_t j = 0; j < want[i].numel(); ++j)
        ASSERT_NEAR(got[i].at(j), want[i].at(j), 1e-5f + 1e-4f * std::abs(want[i].at(j)))
            << "backend " << ir::backend_name(b) << ", output " << i << ", element " << j;
    }
  }
}

// A weight gradient whose x is defined after the bias_add_bwd (a hand-built order) is left
// alone: the fused node could not take the earlier place.
TEST(Fusion, LeavesBiasGradientsWhoseWeightInputComesLater) {
  ir::Graph g;
  ir::Value* dy = ops::parameter(g, "dy", Tensor::full({2, 3, 4, 4}, 0.5f));
  g.add_output(g.add_node(ops::op("bias_add_bwd"), {dy})->output());
  ir::Value* x = ops::parameter(g, "x", Tensor::full({2, 2, 4, 4}, 0.25f));
  g.add_output(
      g.add_node(ops::op("conv2d_bwd_weights"), {dy, x},
                 {{"stride", ir::Ints{1, 1}}, {"pad", ir::Ints{1, 1}}, {"kernel", ir::Ints{3, 3}}})
          ->output());
  EXPECT_FALSE(ops::FuseBiasIntoWeightGradient().run(g)) << ir::to_text(g);
}

namespace {

std::size_t count_masked(const ir::Graph& g, std::string_view op) {
  return static_cast<std::size_t>(
      std::count_if(g.nodes().begin(), g.nodes().end(), [&](const ir::Node* n) {
        return n->op() == op && n->attrs().get<std::string>("activation") == "relu";
      }));
}

}  // namespace

// The training graph of a small ResNet: FuseBiasActivation folds every relu into its BatchNorm or
// residual sum, FuseBatchNormBackward splits every BatchNorm backward, and FuseActivationBackward
// moves every relu_bwd's mask into the BatchNorm backward ops that read its result, folding the
// identity block's gradient sum (its input feeds conv1 and the shortcut) into the one relu_bwd
// left. Loss and gradients are the unfused graph's, exactly (==; a zero's sign aside).
TEST(Fusion, FusesBatchNormAndResidualReluBothWays) {
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = minidl::testing::small_resnet();
  TrainingGraph plain(*model, batch);
  TrainingGraph fused(*model, batch);
  ASSERT_TRUE(ops::FuseBatchNormBackward().run(plain.g));
  ASSERT_TRUE(ops::FuseBiasActivation().run(fused.g));
  ASSERT_TRUE(ops::FuseBatchNormBackward().run(fused.g));
  ASSERT_TRUE(ops::FuseActivationBackward().run(fused.g));

  // 6 BatchNorms; 5 ReLUs: the stem's, and each block's relu1 and the one after its sum.
  EXPECT_EQ(count_op(plain.g, "relu"), 5u);
  EXPECT_EQ(count_op(plain.g, "relu_bwd"), 5u);
  EXPECT_EQ(count_op(fused.g, "relu"), 0u) << ir::to_text(fused.g);
  EXPECT_EQ(count_masked(fused.g, "batch_norm"), 3u);  // the stem's and each block's bn1
  EXPECT_EQ(count_masked(fused.g, "add"), 2u);         // the residual sums
  EXPECT_EQ(count_masked(fused.g, "batch_norm_bwd_reduce"), 6u);
  EXPECT_EQ(count_masked(fused.g, "batch_norm_bwd_data"), 6u);
  // Left: the identity block's relu_bwd, which adds conv1's data gradient (its input's sum).
  ASSERT_EQ(count_op(fused.g, "relu_bwd"), 1u) << ir::to_text(fused.g);
  for (const ir::Node* n : fused.g.nodes())
    if (n->op() == "relu_bwd") {
      EXPECT_EQ(n->inputs().size(), 3u) << n->describe();
    }
  // The forward sums stay (with their ReLU); one of the two gradient sums is folded.
  EXPECT_EQ(count_op(fused.g, "add"), count_op(plain.g, "add") - 1);
  EXPECT_FALSE(ops::FuseActivationBackward(false).run(plain.g));

  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  for (ir::Backend b : backends) {
    SCOPED_TRACE(ir::backend_name(b));
    const auto want = plain.run(b);
    const auto got = fused.run(b);
    ASSERT_EQ(want.size(), got.size());
    for (std::size_t k = 0; k < want.size(); ++k)
      for (std::int64_t i = 0; i < want[k].numel(); ++i)
        ASSERT_EQ(got[k].at(i), want[k].at(i)) << "output " << k << " element " << i;
  }
}

// The small ResNet's forward sums fold into the BatchNorm before them (FuseResidualIntoBatchNorm):
// the identity block's add(bn2, x) and the projection block's add(bn2, shortcut BN), each with its
// ReLU, become batch_norm nodes with a residual input, the shortcut's BatchNorm staying as it is.
// On the native kernels the loss and gradients are the unfused graph's bits; on oneDNN's (whose
// unfused BatchNorm and sum are its own) they agree to rounding, in its blocked layouts too.
// Disabled, the pass changes nothing; a sum whose BatchNorm output has another reader stays.
TEST(Fusion, FoldsTheResidualSumIntoTheBatchNorm) {
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = minidl::testing::small_resnet();
  TrainingGraph plain(*model, batch);
  TrainingGraph fused(*model, batch);
  for (TrainingGraph* t : {&plain, &fused}) {
    ASSERT_TRUE(ops::FuseBiasActivation().run(t->g));
    ASSERT_TRUE(ops::FuseBatchNormBackward().run(t->g));
  }
  EXPECT_FALSE(ops::FuseResidualIntoBatchNorm(false).run(plain.g));
  ASSERT_TRUE(ops::FuseResidualIntoBatchNorm().run(fused.g));
  ASSERT_TRUE(ops::FuseActivationBackward().run(plain.g));
  ASSERT_TRUE(ops::FuseActivationBackward().run(fused.g));

  EXPECT_EQ(count_op(fused.g, "add"), count_op(plain.g, "add") - 2) << ir::to_text(fused.g);
  EXPECT_EQ(count_op(fused.g, "batch_norm"), count_op(plain.g, "batch_norm"));
  for (const char* name : {"block1.bn2.batch_norm+add+relu", "block2.bn2.batch_norm+add+relu"}) {
    const ir::Node* n = fused.g.find(name);
    ASSERT_NE(n, nullptr) << name << "\n" << ir::to_text(fused.g);
    EXPECT_EQ(n->inputs().size(), 6u) << n->describe();
    EXPECT_EQ(n->attrs().get<std::string>("activation"), "relu") << n->describe();
  }
  EXPECT_NE(fused.g.find("block2.shortcut.1.batch_norm"), nullptr) << ir::to_text(fused.g);

  const auto want = plain.run(ir::Backend::Native);
  const auto got = fused.run(ir::Backend::Native);
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t k = 0; k < want.size(); ++k)
    for (std::int64_t i = 0; i < want[k].numel(); ++i)
      ASSERT_EQ(got[k].at(i), want[k].at(i)) << "output " << k << " element " << i;
#if MINIDL_WITH_ONEDNN
  ASSERT_TRUE(ops::PropagateLayouts(ir::Backend::OneDnn).run(fused.g) ||
              ops::blocked_layout().empty());
  const auto blocked = fused.run(ir::Backend::OneDnn);
  for (std::size_t k = 0; k < want.size(); ++k)
    for (std::int64_t i = 0; i < want[k].numel(); ++i)
      ASSERT_NEAR(blocked[k].at(i), want[k].at(i), 1e-4f * (1.0f + std::abs(want[k].at(i))))
          << "output " << k << " element " << i;
#endif

  // bn2's output read by another node too: that sum stays.
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", Shape{2, 3, 4, 4});
  ir::Value* r = ops::input(g, "r", Shape{2, 3, 4, 4});
  auto [mean, var] = ops::bn_moments(ops::bn_stats(x));
  ir::Value* w = ops::input(g, "w", Shape{3});
  ir::Value* b = ops::input(g, "b", Shape{3});
  ir::Value* y = ops::batch_norm(x, mean, var, w, b);
  g.add_output(ops::add(y, r));
  g.add_output(y);
  EXPECT_FALSE(ops::FuseResidualIntoBatchNorm().run(g)) << ir::to_text(g);

  // A BatchNorm with weight only takes a following bias_add as its bias (FuseBiasActivation),
  // and then the sum after it.
  ir::Graph h;
  ir::Value* hx = ops::input(h, "x", Shape{2, 3, 4, 4});
  auto [hmean, hvar] = ops::bn_moments(ops::bn_stats(hx));
  ir::Value* biased = ops::bias_add(ops::batch_norm(hx, hmean, hvar, ops::input(h, "w", Shape{3})),
                                    ops::input(h, "b", Shape{3}));
  h.add_output(ops::add(ops::input(h, "r", Shape{2, 3, 4, 4}), biased));
  ASSERT_TRUE(ops::FuseBiasActivation().run(h));
  ASSERT_TRUE(ops::FuseResidualIntoBatchNorm().run(h)) << ir::to_text(h);
  EXPECT_EQ(count_op(h, "bias_add"), 0u);
  EXPECT_EQ(count_op(h, "add"), 0u);
  ASSERT_EQ(h.outputs()[0]->producer()->op(), "batch_norm") << ir::to_text(h);
  EXPECT_EQ(h.outputs()[0]->producer()->inputs().size(), 6u) << ir::to_text(h);
}

// A relu_bwd whose result is a graph output, or is read by an op that cannot take the mask (the
// data gradient of a convolution without BatchNorm), stays as it is.
TEST(Fusion, LeavesReluBackwardWithOtherReadersAlone) {
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>("conv1", 1, 4, 3, 1, 1, nn::Init::He, false);
  model->emplace<nn::ReLU>("relu1");
  model->emplace<nn::Conv2d>("conv2", 4, 4, 3, 1, 1, nn::Init::He, false);
  model->emplace<nn::BatchNorm2d>("bn", 4);
  model->emplace<nn::ReLU>("relu2");
  model->emplace<nn::Flatten>("flatten");
  model->emplace<nn::Linear>("fc", 4 * 64, 10, nn::Init::Xavier);
  model->reset(2);
  TrainingGraph t(*model, batch);
  ops::FuseBatchNormBackward().run(t.g);
  // conv1 + relu1 fold into one convolution; bn + relu2 into one batch_norm.
  ASSERT_TRUE(ops::FuseBiasActivation().run(t.g));
  ASSERT_EQ(count_op(t.g, "relu_bwd"), 2u);
  ir::Value* kept = nullptr;  // relu2's backward, made a graph output
  for (ir::Node* n : t.g.nodes()) {
    const bool bn_reader =
        n->op() == "relu_bwd" && n->output(0)->users()[0]->op().starts_with("batch_norm_bwd");
    if (bn_reader) kept = n->output(0);
  }
  ASSERT_NE(kept, nullptr) << ir::to_text(t.g);
  t.g.add_output(kept);
  EXPECT_FALSE(ops::FuseActivationBackward().run(t.g)) << ir::to_text(t.g);
  EXPECT_EQ(count_op(t.g, "relu_bwd"), 2u);
}
