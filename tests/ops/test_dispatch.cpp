// Kernel dispatch across backends: the preferred backend's kernel when it accepts the node,
// native where oneDNN has no kernel, a node's "backend" annotation over the global choice, and
// the same training on both backends; the choice recorded once per node and dropped when the
// node changes.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/runtime/executable.hpp"
#include "support/synthetic.hpp"

using namespace minidl;

namespace {

#if !MINIDL_WITH_ONEDNN
#define SKIP_WITHOUT_ONEDNN() GTEST_SKIP() << "built without oneDNN (MINIDL_WITH_ONEDNN=OFF)"
#else
#define SKIP_WITHOUT_ONEDNN() (void)0
#endif

// x [8,20] -> relu(bias_add(matmul(x, w^T), b)) [8,32] (a product the native GEMM is not
// preferred for: wider than 16, a small weight)
struct Layer {
  Tensor w = Tensor::empty({32, 20}), b = Tensor::zeros({32});
  ir::Graph g;
  ir::Node* matmul = nullptr;
  ir::Value* y = nullptr;
  Layer() {
    CounterRng(5).fill_normal(w, 1, 0.0f, 0.3f);
    ir::Value* x = ops::input(g, "x", {8, 20});
    ir::Value* h = ops::matmul(x, ops::parameter(g, "w", w), false, true);
    matmul = h->producer();
    y = ops::relu(ops::bias_add(h, ops::parameter(g, "b", b)));
    g.add_output(y);
  }
};

// The kernel chosen for the (only) node of op `op` in an executable's kernel table.
std::string kernel_of(const runtime::Executable& exe, const std::string& op) {
  std::istringstream lines(exe.kernel_table());
  std::string line, found;
  while (std::getline(lines, line)) {
    if (line.rfind(op + " ", 0) != 0) continue;
    EXPECT_TRUE(found.empty()) << "two " << op << " nodes in\n" << exe.kernel_table();
    found = line.substr(line.rfind(" -> ") + 4);
  }
  EXPECT_FALSE(found.empty()) << "no " << op << " node in\n" << exe.kernel_table();
  return found;
}

}  // namespace

TEST(Dispatch, NativeBackendPicksNativeKernels) {
  Layer l;
  runtime::Executable exe(l.g, {.backend = ir::Backend::Native});
  EXPECT_EQ(kernel_of(exe, "matmul"), "native");
  EXPECT_EQ(kernel_of(exe, "bias_add"), "native");
  EXPECT_EQ(kernel_of(exe, "relu"), "native");
}

TEST(Dispatch, OneDnnBackendPicksOneDnnAndFallsBackToNative) {
  SKIP_WITHOUT_ONEDNN();
  Layer l;
  runtime::Executable exe(l.g, {.backend = ir::Backend::OneDnn});
  EXPECT_EQ(kernel_of(exe, "matmul"), "onednn");
  EXPECT_EQ(kernel_of(exe, "bias_add"), "native");  // oneDNN has no bias_add kernel here
  EXPECT_EQ(kernel_of(exe, "relu"), "onednn");
}

// The native f32 GEMM goes before oneDNN's matmul where it was measured faster (matmul.cpp):
// narrow products (at most 16 columns in the sum or the output: a classifier and its data
// gradient) and a batch of at most 64 rows against a weight of 1 MiB or more; a node's backend
// annotation still wins.
TEST(Dispatch, NativeGemmIsPreferredForNarrowAndLargeWeightProducts) {
  SKIP_WITHOUT_ONEDNN();
  struct Case {
    Shape x, w;  // y = x w^T
    const char* want;
  };
  const Case cases[] = {
      {{32, 256}, {10, 256}, "native"},     // a classifier's forward
      {{32, 10}, {256, 10}, "native"},      // its data gradient's shape: a sum of 10 terms
      {{32, 4096}, {256, 4096}, "native"},  // the CIFAR CNN's fc1: a 4 MiB weight
      {{65, 4096}, {256, 4096}, "onednn"},  // more rows than a batch of 64
      {{64, 784}, {256, 784}, "onednn"},    // the MLP's first layer: 0.8 MiB
      {{8, 20}, {32, 20}, "onednn"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("x {} w {}", c.x.str(), c.w.str()));
    ir::Graph g;
    g.add_output(ops::matmul(ops::input(g, "x", c.x), ops::parameter(g, "w", Tensor::zeros(c.w)),
                             false, true));
    runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
    EXPECT_EQ(kernel_of(exe, "matmul"), c.want);
  }
  ir::Graph g;
  ir::Value* y = ops::matmul(ops::input(g, "x", {32, 256}),
                             ops::parameter(g, "w", Tensor::zeros({10, 256})), false, true);
  y->producer()->annotations().set("backend", std::string("onednn"));
  g.add_output(y);
  runtime::Executable exe(g, {.backend = ir::Backend::OneDnn});
  EXPECT_EQ(kernel_of(exe, "matmul"), "onednn");
}

TEST(Dispatch, NodeAnnotationOverridesTheGlobalBackend) {
  SKIP_WITHOUT_ONEDNN();
  Layer l;
  l.matmul->annotations().set("backend", std::string("native"));
  runtime::Executable exe(l.g, {.backend = ir::Backend::OneDnn});
  EXPECT_EQ(kernel_of(exe, "matmul"), "native");
  EXPECT_EQ(kernel_of(exe, "relu"), "onednn");

  Layer l2;
  l2.matmul->annotations().set("backend", std::string("onednn"));
  runtime::Executable exe2(l2.g, {.backend = ir::Backend::Native});
  EXPECT_EQ(kernel_of(exe2, "matmul"), "onednn");
  EXPECT_EQ(kernel_of(exe2, "relu"), "native");
}

TEST(Dispatch, BothBackendsComputeTheSameLayer) {
  SKIP_WITHOUT_ONEDNN();
  Layer l;
  runtime::Executable native(l.g, {.backend = ir::Backend::Native});
  runtime::Executable onednn(l.g, {.backend = ir::Backend::OneDnn});
  for (runtime::Executable* e : {&native, &onednn}) {
    Tensor x = e->input("x");
    CounterRng(8).fill_uniform(x, 0, -1.0f, 1.0f);
    e->run();
    e->run();  // a second step reuses the bound buffers
  }
  const Tensor& a = native.value(l.y);
  const Tensor& b = onednn.value(l.y);
  for (std::int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a.at(i), b.at(i), 1e-5) << i;
}

// Kernels are created once for a node; when the tensors they are given move, they follow.
TEST(Dispatch, OneDnnKernelRebindsWhenBuffersMove) {
  SKIP_WITHOUT_ONEDNN();
  ir::Graph g;
  ir::Node* relu = ops::relu(ops::input(g, "x", {4, 9}))->producer();
  const ir::KernelDef* def = nullptr;
  for (const ir::KernelDef& k : relu->def().kernels())
    if (k.backend == ir::Backend::OneDnn) def = &k;
  ASSERT_NE(def, nullptr);
  const ir::Kernel kernel = def->make(*relu);
  auto run = [&](float value) {
    std::vector<Tensor> in{Tensor::full({4, 9}, value)}, out{Tensor::zeros({4, 9})};
    kernel(ir::KernelArgs{relu, in, out});
    return out[0];
  };
  const Tensor first = run(2.0f);
  const Tensor second = run(-3.0f);
  const Tensor third = run(5.0f);
  EXPECT_EQ(first.at(0), 2.0f);
  EXPECT_EQ(second.at(35), 0.0f);
  EXPECT_EQ(third.at(17), 5.0f);
  EXPECT_EQ(first.at(0), 2.0f);  // not overwritten by the later calls

  std::vector<Tensor> in{Tensor::full({4, 8}, 1.0f)}, out{Tensor::zeros({4, 8})};
  try {
    kernel(ir::KernelArgs{relu, in, out});
    FAIL() << "a kernel compiled for [4,9] ran on [4,8]";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("relu"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("compiled for 144 bytes"));
  }
}

// One model per activation, trained for a few steps from the same initialisation with each
// backend: the losses agree to 1e-5 relative and so do the trained weights.
TEST(Dispatch, TrainingGivesTheSameLossOnBothBackends) {
  SKIP_WITHOUT_ONEDNN();
  const Dataset train = minidl::testing::blobs(96, 21);
  for (const std::string act : {"relu", "sigmoid", "tanh"}) {
    SCOPED_TRACE(act);
    auto run = [&](ir::Backend backend) {
      auto m = std::make_unique<nn::Sequential>();
      m->emplace<nn::Flatten>("flatten");
      m->emplace<nn::Linear>("fc1", 64, 32, nn::Init::He);
      m->add(nn::make_activation(act), "act1");
      m->emplace<nn::Linear>("fc2", 32, 16, nn::Init::Xavier);
      m->add(nn::make_activation(act), "act2");
      m->emplace<nn::Linear>("fc3", 16, 10, nn::Init::Xavier);
      m->reset(3);
      optim::Sgd sgd({.lr = 0.1, .momentum = 0.5});
      TrainerOptions opt;
      opt.batch_size = 32;  // three steps per epoch
      opt.seed = 4;
      opt.compile.backend = backend;
      Trainer t(*m, sgd, opt);
      std::vector<double> losses;
      for (int epoch = 1; epoch <= 2; ++epoch) losses.push_back(t.train_epoch(train, epoch).loss);
      return std::make_pair(losses, m->parameters()[0].second.clone());
    };
    const auto [native_loss, native_w] = run(ir::Backend::Native);
    const auto [onednn_loss, onednn_w] = run(ir::Backend::OneDnn);
    for (std::size_t e = 0; e < native_loss.size(); ++e) {
      EXPECT_NEAR(onednn_loss[e], native_loss[e], 1e-5 * std::fabs(native_loss[e]))
          << "epoch " << e + 1;
    }
    for (std::int64_t i = 0; i < native_w.numel(); ++i)
      ASSERT_NEAR(onednn_w.at(i), native_w.at(i), 1e-5 * (1.0 + std::fabs(native_w.at(i)))) << i;
  }
}

namespace {

// x [2,3,10,10] -> conv2d(w, b, relu) [2,8,10,10] -> max_pool2d 2x2 [2,8,5,5] -> avg_pool2d 2x2
// (pad 1, count_include_pad off) [2,8,3,3] -> sum, with the gradients of x, w and b.
struct ConvNet {
  Tensor w = Tensor::empty({8, 3, 3, 3}), b = Tensor::empty({8});
  ir::Graph g;
  ir::Value* loss = nullptr;
  std::vector<ir::Value*> grads;
  ConvNet() {
    CounterRng(6).fill_normal(w, 1, 0.0f, 0.3f);
    CounterRng(6).fill_normal(b, 2, 0.0f, 0.3f);
    ir::Value* x = ops::input(g, "x", {2, 3, 10, 10});
    ir::Value* wv = ops::parameter(g, "w", w);
    ir::Value* bv = ops::parameter(g, "b", b);
    ir::Value* y = ops::apply("conv2d", {x, wv, bv},
                              {{"pad", ir::Ints{1, 1}}, {"activation", std::string("relu")}});
    y = ops::apply("max_pool2d", {y}, {{"kernel", ir::Ints{2, 2}}});
    y = ops::apply(
        "avg_pool2d", {y},
        {{"kernel", ir::Ints{2, 2}}, {"pad", ir::Ints{1, 1}}, {"count_include_pad", false}});
    loss = ops::sum(y);
    grads = autograd::differentiate(g, loss, {x, wv, bv});
    g.add_output(loss);
    for (ir::Value* v : grads) g.add_output(v);
  }
};

const char* const kConvNetOps[] = {"conv2d",        "conv2d_bwd_data", "conv2d_bwd_weights",
                                   "max_pool2d",    "max_pool2d_bwd",  "avg_pool2d",
                                   "avg_pool2d_bwd"};

}  // namespace

TEST(Dispatch, ConvolutionAndPoolingNodesTakeTheChosenBackend) {
  ConvNet net;
  runtime::Executable native(net.g, {.backend = ir::Backend::Native});
  for (const char* op : kConvNetOps) EXPECT_EQ(kernel_of(native, op), "native") << op;
#if MINIDL_WITH_ONEDNN
  // Max pooling's native kernels are declared preferred (OpDef::preferred): they run under
  // either backend.
  runtime::Executable onednn(net.g, {.backend = ir::Backend::OneDnn});
  for (const char* op : kConvNetOps) {
    const bool preferred = std::string_view(op).starts_with("max_pool2d");
    EXPECT_EQ(kernel_of(onednn, op), preferred ? "native" : "onednn") << op;
  }
#endif
}

TEST(Dispatch, BackendAnnotationWinsOverAPreferredKernel) {
  SKIP_WITHOUT_ONEDNN();
  ConvNet net;
  for (ir::Node* n : net.g.nodes())
    if (n->op().starts_with("max_pool2d")) n->annotations().set("backend", std::string("onednn"));
  runtime::Executable onednn(net.g, {.backend = ir::Backend::Native});
  EXPECT_EQ(kernel_of(onednn, "max_pool2d"), "onednn");
  EXPECT_EQ(kernel_of(onednn, "max_pool2d_bwd"), "onednn");
  EXPECT_EQ(kernel_of(onednn, "conv2d"), "native");
}

TEST(Dispatch, BothBackendsComputeTheSameConvNet) {
  SKIP_WITHOUT_ONEDNN();
  ConvNet net;
  runtime::Executable native(net.g, {.backend = ir::Backend::Native});
  runtime::Executable onednn(net.g, {.backend = ir::Backend::OneDnn});
  for (runtime::Executable* e : {&native, &onednn}) {
    Tensor x = e->input("x");
    CounterRng(9).fill_normal(x, 0, 0.0f, 1.0f);
    e->run();
    e->run();  // a second step reuses the bound buffers and the reorders' own
  }
  for (ir::Value* v : net.g.outputs()) {
    const Tensor& a = native.value(v);
    const Tensor& b = onednn.value(v);
    for (std::int64_t i = 0; i < a.numel(); ++i)
      ASSERT_NEAR(a.at(i), b.at(i), 1e-4 * (1.0 + std::fabs(a.at(i)))) << v->ref() << " " << i;
  }
}

namespace {

// An op whose one kernel counts how often it is asked whether it takes a node: how often its
// node's kernel is chosen.
int supports_calls = 0;
bool counting_supports(const ir::Node&, std::string*) {
  ++supports_calls;
  return true;
}
void copy_kernel(const ir::KernelArgs& k) {
  ops::map_unary(k, [](float x) { return x; });
}
const ir::OpDef kCountedCopy = ir::OpDef("counted_copy")
                                   .inputs({"x"})
                                   .infer(ops::infer_unary_f32)
                                   .elementwise()
                                   .kernel(ir::Backend::Native, copy_kernel, counting_supports)
                                   .no_grad("test op");

}  // namespace

// The passes record each node's kernel once (ir::choose_kernels) and the runtime takes the
// record; replacing the node's input or changing a layout it sees drops the record, and the next
// call chooses again.
TEST(Dispatch, KernelIsChosenOnceAndChosenAgainWhenTheNodeChanges) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 16, 4, 4});
  ir::Node* n = g.add_node(kCountedCopy, {x});
  g.add_output(n->output());
  supports_calls = 0;
  EXPECT_EQ(n->kernel(ir::Backend::Native), nullptr);
  ir::choose_kernels(g, ir::Backend::Native);
  ASSERT_NE(n->kernel(ir::Backend::Native), nullptr);
  EXPECT_EQ(n->kernel(ir::Backend::Native)->kernel, &kCountedCopy.kernels()[0]);
  ir::choose_kernels(g, ir::Backend::Native);  // the record holds
  { runtime::Executable exe(g, {.backend = ir::Backend::Native}); }
  EXPECT_EQ(supports_calls, 1);

  // Made for native first, it does not hold for a graph compiled for oneDNN first, unless the
  // node's annotation puts native first anyway.
  EXPECT_EQ(n->kernel(ir::Backend::OneDnn), nullptr);
  n->annotations().set("backend", std::string("native"));
  EXPECT_NE(n->kernel(ir::Backend::OneDnn), nullptr);

  // A layout change around the node: chosen again, for the layouts it now sees.
  x->set_layout("nChw16c");
  EXPECT_EQ(n->kernel(ir::Backend::Native), nullptr);
  ir::choose_kernels(g, ir::Backend::Native);
  EXPECT_EQ(supports_calls, 1);  // refused for its layouts before supports was asked
  ASSERT_NE(n->kernel(ir::Backend::Native), nullptr);
  EXPECT_EQ(n->kernel(ir::Backend::Native)->kernel, nullptr);
  EXPECT_THAT(n->kernel(ir::Backend::Native)->declined,
              ::testing::HasSubstr("an elementwise kernel needs one layout"));
  n->output()->set_layout("nChw16c");
  ir::choose_kernels(g, ir::Backend::Native);
  EXPECT_EQ(supports_calls, 2);
  EXPECT_EQ(n->kernel(ir::Backend::Native)->kernel, &kCountedCopy.kernels()[0]);

  // A new input: chosen again.
  ir::Value* y = ops::input(g, "y", {2, 16, 4, 4});
  y->set_layout("nChw16c");
  g.replace_uses(x, y);
  EXPECT_EQ(n->kernel(ir::Backend::Native), nullptr);
  { runtime::Executable exe(g, {.backend = ir::Backend::Native}); }  // chooses, records nothing
  EXPECT_EQ(supports_calls, 3);
  EXPECT_EQ(n->kernel(ir::Backend::Native), nullptr);
}
