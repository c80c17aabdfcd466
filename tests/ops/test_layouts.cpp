// Layout propagation: which values of a CNN's training graph get oneDNN's blocked layout, that
// the graph computes the same loss and gradients with and without it, and that the runtime
// refuses a kernel that cannot read a value's layout. Also the native bias gradient on blocked
// input, against a plain reference.
#include <gmock/gmock.h>

#include <cmath>
#include <cstring>

#include "../support/synthetic.hpp"
#include "../support/training_graph.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using minidl::testing::TrainingGraph;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

// conv 16 -> relu -> pool -> conv 16 -> relu -> pool -> flatten -> linear: enough channels for
// a block of 16 (or 8) in every activation but the input's.
std::unique_ptr<nn::Sequential> small_cnn() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv1", 1, 16, 3, 1, 1, nn::Init::He);
  m->emplace<nn::ReLU>("relu1");
  m->emplace<nn::MaxPool2d>("pool1", 2);
  m->emplace<nn::Conv2d>("conv2", 16, 16, 3, 1, 1, nn::Init::He);
  m->emplace<nn::ReLU>("relu2");
  m->emplace<nn::MaxPool2d>("pool2", 2);
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc", 16 * 2 * 2, 10, nn::Init::Xavier);
  return m;
}

std::string layout_of(const ir::Graph& g, std::string_view node, int output = 0) {
  const ir::Node* n = g.find(node);
  return n ? n->output(output)->layout() : "<no node " + std::string(node) + ">";
}

}  // namespace

TEST(Layouts, NativeGraphsStayPlain) {
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = small_cnn();
  model->reset(5);
  TrainingGraph t(*model, batch);
  ops::FuseBiasActivation().run(t.g);
  EXPECT_FALSE(ops::PropagateLayouts(ir::Backend::Native).run(t.g));
  for (const ir::Node* n : t.g.nodes())
    for (const ir::Value* v : n->outputs()) EXPECT_EQ(v->layout(), "") << n->describe();
  // The pass leaves every node that runs a kernel with its kernel recorded, for the runtime.
  for (const ir::Node* n : t.g.nodes()) {
    if (n->def().is_source() || n->def().is_alias()) continue;
    ASSERT_NE(n->kernel(ir::Backend::Native), nullptr) << n->describe();
    EXPECT_EQ(n->kernel(ir::Backend::Native)->kernel->backend, ir::Backend::Native);
  }
}

#if MINIDL_WITH_ONEDNN
TEST(Layouts, OneDnnRunsKeepTheBlockedLayoutAndTheResults) {
  const std::string& blocked = ops::blocked_layout();
  if (blocked.empty()) GTEST_SKIP() << "oneDNN uses no channel-blocked layout on this CPU";
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = small_cnn();
  model->reset(5);
  TrainingGraph plain(*model, batch);
  TrainingGraph propagated(*model, batch);
  ops::FuseBiasActivation().run(plain.g);  // the trainer's order: fusion, then layouts
  ops::FuseBiasActivation().run(propagated.g);
  ASSERT_TRUE(ops::PropagateLayouts(ir::Backend::OneDnn).run(propagated.g));
  const ir::Graph& g = propagated.g;
  // Every kernel is recorded, and as chosen for the layouts the pass gave: what the runtime takes.
  for (const ir::Node* n : g.nodes()) {
    if (n->def().is_source() || n->def().is_alias()) continue;
    const ir::KernelChoice* c = n->kernel(ir::Backend::OneDnn);
    ASSERT_NE(c, nullptr) << n->describe();
    EXPECT_EQ(c->kernel, ir::choose_kernel(*n, ir::Backend::OneDnn).kernel) << n->describe();
  }

  // Between oneDNN's convolutions and pooling, and through the ReLU backward that sits between
  // them: blocked. Max pooling's argmax too (both pooling kernels are oneDNN's).
  EXPECT_EQ(layout_of(g, "conv1.conv2d+bias+relu"), blocked) << ir::to_text(g);
  EXPECT_EQ(layout_of(g, "pool1.max_pool2d"), blocked);
  EXPECT_EQ(layout_of(g, "pool1.max_pool2d", 1), blocked);
  EXPECT_EQ(layout_of(g, "conv2.conv2d+bias+relu"), blocked);
  EXPECT_EQ(layout_of(g, "relu2.relu.bwd"), blocked);
  EXPECT_EQ(layout_of(g, "conv2.conv2d.bwd"), blocked);  // the data gradient
  // Where a plain-only op reads or writes: the flatten's input, the input image (1 channel),
  // weight gradients (the optimizer's), graph outputs.
  EXPECT_EQ(layout_of(g, "pool2.max_pool2d"), "");
  EXPECT_EQ(layout_of(g, "x"), "");
  for (const ir::Value* v : g.outputs()) EXPECT_EQ(v->layout(), "") << v->ref();
  EXPECT_THAT(ir::to_text(g), HasSubstr(" " + blocked));

  // The same loss and gradients: the convolutions and the pooling compute the same sums, only
  // the bias gradients add up a blocked tensor in another order.
  const auto want = plain.run(ir::Backend::OneDnn);
  const auto got = propagated.run(ir::Backend::OneDnn);
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].shape(), got[i].shape());
    for (std::int64_t j = 0; j < want[i].numel(); ++j) {
      const float a = want[i].at(j), b = got[i].at(j);
      EXPECT_NEAR(a, b, 1e-5f * (1.0f + std::abs(a))) << "output " << i << " element " << j;
    }
  }
  // And against the native backend, whose kernels are the reference.
  const auto native = plain.run(ir::Backend::Native);
  for (std::size_t i = 0; i < native.size(); ++i)
    for (std::int64_t j = 0; j < native[i].numel(); ++j)
      EXPECT_NEAR(native[i].at(j), got[i].at(j), 1e-4f * (1.0f + std::abs(native[i].at(j))))
          << "output " << i << " element " << j;
}

// conv 16 -> relu -> residual block (conv 16 -> relu -> conv 16, identity shortcut, relu) ->
// global average pooling -> flatten -> linear: the sum and the pooling between convolutions.
std::unique_ptr<nn::Sequential> small_residual_cnn() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Conv2d>("conv1", 1, 16, 3, 1, 1, nn::Init::He);
  m->emplace<nn::ReLU>("relu1");
  auto block = std::make_unique<nn::Residual>();
  block->emplace<nn::Conv2d>("conv1", 16, 16, 3, 1, 1, nn::Init::He, false);
  block->emplace<nn::ReLU>("relu1");
  block->emplace<nn::Conv2d>("conv2", 16, 16, 3, 1, 1, nn::Init::He, false);
  block->emplace_post<nn::ReLU>("relu");
  m->add(std::move(block), "block");
  m->emplace<nn::AdaptiveAvgPool2d>("pool", 1);
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc", 16, 10, nn::Init::Xavier);
  return m;
}

// The residual sum (add, elementwise) and its gradient sum at the fan-out keep the blocked
// layout of the convolutions around them; global average pooling reads it.
TEST(Layouts, OneDnnKeepsResidualSumsBlocked) {
  const std::string& blocked = ops::blocked_layout();
  if (blocked.empty()) GTEST_SKIP() << "oneDNN uses no channel-blocked layout on this CPU";
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = small_residual_cnn();
  model->reset(5);
  TrainingGraph plain(*model, batch);
  TrainingGraph propagated(*model, batch);
  ops::FuseBiasActivation().run(plain.g);
  ops::FuseBiasActivation().run(propagated.g);
  ASSERT_TRUE(ops::PropagateLayouts(ir::Backend::OneDnn).run(propagated.g));
  const ir::Graph& g = propagated.g;
  // The sum with its ReLU folded in (ops::FuseBiasActivation).
  EXPECT_EQ(layout_of(g, "block.add+relu"), blocked) << ir::to_text(g);
  EXPECT_EQ(g.find("block.relu.relu"), nullptr);
  // The block's input feeds conv1 and the sum: its gradient is an add of two blocked values.
  int blocked_grad_sums = 0;
  for (const ir::Node* n : g.nodes())
    if (n->op() == "add" && n->phase() == ir::Phase::Backward)
      blocked_grad_sums += n->output()->layout() == blocked;
  EXPECT_EQ(blocked_grad_sums, 1) << ir::to_text(g);
  EXPECT_EQ(layout_of(g, "pool.avg_pool2d"), "");  // read by the flatten
  const auto want = plain.run(ir::Backend::Native);
  const auto got = propagated.run(ir::Backend::OneDnn);
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    for (std::int64_t j = 0; j < want[i].numel(); ++j)
      EXPECT_NEAR(want[i].at(j), got[i].at(j), 1e-4f * (1.0f + std::abs(want[i].at(j))))
          << "output " << i << " element " << j;
}
#endif

TEST(Layouts, RuntimeRefusesKernelsThatCannotReadALayout) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 16, 4, 4});
  x->set_layout("nChw16c");
  // bias_add has one kernel, native and plain-only.
  ir::Value* y = ops::bias_add(x, ops::input(g, "b", {16}));
  g.add_output(y);
  EXPECT_THAT([&] { runtime::Executable exe(g, {.backend = ir::Backend::Native}); },
              ThrowsMessage<Error>(AllOf(HasSubstr("no kernel accepts this node"),
                                         HasSubstr("is in layout nChw16c; this kernel takes "
                                                   "plain values only"))));
  // An elementwise op is fine with one layout for all its values, not with two.
  ir::Graph h;
  ir::Value* a = ops::input(h, "a", {2, 16, 4, 4});
  ir::Value* b = ops::input(h, "b", {2, 16, 4, 4});
  a->set_layout("nChw16c");
  h.add_output(h.add_node(ops::op("relu_bwd"), {a, b})->output());
  EXPECT_THAT([&] { runtime::Executable exe(h, {.backend = ir::Backend::Native}); },
              ThrowsMessage<Error>(HasSubstr("an elementwise kernel needs one layout")));
  b->set_layout("nChw16c");
  h.outputs()[0]->set_layout("nChw16c");
  EXPECT_NO_THROW(runtime::Executable(h, {.backend = ir::Backend::Native}));
}

TEST(Layouts, SetLayoutChecksTheValue) {
  ir::Graph g;
  EXPECT_THAT(
      [&] {
        ops::input(g, "a", {2, 8, 4, 4})->set_layout("nChw16c");
      },
      ThrowsMessage<Error>(HasSubstr("channels are a multiple of 16, got [2,8,4,4]")));
  EXPECT_THAT(
      [&] {
        ops::input(g, "b", {2, 16})->set_layout("nChw16c");
      },
      ThrowsMessage<Error>(HasSubstr("needs a 4-D f32 or i32 value")));
  EXPECT_THAT(
      [&] {
        ops::input(g, "c", {2, 16, 4, 4})->set_layout("nchw");
      },
      ThrowsMessage<Error>(HasSubstr("unknown layout 'nchw'")));
  EXPECT_THAT(
      [&] {
        ops::input(g, "e", {2, 16})->set_layout("nhwc");
      },
      ThrowsMessage<Error>(HasSubstr("needs a 4-D f32 or i32 value")));
  ir::Value* ok = ops::input(g, "d", {2, 8, 4, 4});
  ok->set_layout("nChw8c");
  EXPECT_EQ(ok->layout(), "nChw8c");
  EXPECT_EQ(ir::channel_block("nChw8c"), 8);
  EXPECT_EQ(ir::channel_block(""), 1);
  ir::Value* channels_last = ops::input(g, "f", {2, 3, 4, 4});
  channels_last->set_layout("nhwc");  // no blocks: any channel count
  EXPECT_EQ(ir::channel_block("nhwc"), 1);
  // Only an f32 value may be stored as bf16.
  channels_last->set_stored(DType::BF16);
  EXPECT_EQ(channels_last->stored(), DType::BF16);
  EXPECT_EQ(channels_last->dtype(), DType::F32);
  ir::Value* labels = ops::input(g, "labels", {2}, DType::I32);
  EXPECT_THAT([&] { labels->set_stored(DType::BF16); },
              ThrowsMessage<Error>(HasSubstr("is i32 and cannot be stored as bf16")));
}

// A kernel without KernelDef::bf16_values is not given a value stored as bf16: the runtime
// refuses the node, naming the value.
TEST(Layouts, KernelsRefuseBf16ValuesUnlessTheyDeclareThem) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 16, 4, 4});
  ir::Value* y = ops::sigmoid(x);  // sigmoid's kernels take f32 values only
  ir::Value* z = ops::sigmoid(y);
  g.add_output(z);
  y->set_stored(DType::BF16);
  EXPECT_THAT([&] { runtime::Executable exe(g); },
              ThrowsMessage<Error>(HasSubstr("is stored as bf16; this kernel takes f32")));
}

// The native bias gradient reads a blocked diff_dst: element (n, c, h, w) at
// ((n * C/B + c/B) * H*W + h*W + w) * B + c%B.
TEST(Layouts, BiasGradientOfBlockedInput) {
  for (const char* layout : {"nChw16c", "nChw8c"}) {
    const std::int64_t n = 3, ch = 32, h = 5, w = 7, block = ir::channel_block(layout);
    Tensor plain = Tensor::empty({n, ch, h, w});
    CounterRng(11).fill_normal(plain, 0, 0.0f, 1.0f);
    ir::Graph g;
    ir::Value* dy = ops::input(g, "dy", {n, ch, h, w});
    dy->set_layout(layout);
    ir::Value* db = g.add_node(ops::op("bias_add_bwd"), {dy})->output();
    g.add_output(db);
    runtime::Executable exe(g);
    float* blocked = exe.input("dy").data<float>();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < ch; ++c)
        for (std::int64_t s = 0; s < h * w; ++s)
          blocked[((i * (ch / block) + c / block) * h * w + s) * block + c % block] =
              plain.at((i * ch + c) * h * w + s);
    exe.run();
    for (std::int64_t c = 0; c < ch; ++c) {
      double want = 0.0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < h * w; ++s) want += plain.at((i * ch + c) * h * w + s);
      EXPECT_NEAR(exe.value(db).at(c), want, 1e-4) << layout << " channel " << c;
    }
  }
}

namespace {
/// The bf16 nearest to f (ties to even), as oneDNN's conversions round, as its 16 bits.
std::uint16_t to_bf16(float f) {
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float from_bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

// The native bias gradient reads a diff_dst stored as bf16, in the layouts of oneDNN's bf16
// convolutions (nhwc: element (n, c, h, w) at ((n * H + h) * W + w) * C + c; blocked) and plain,
// and sums the bf16 values exactly as f32 (they are f32 values with 8-bit significands).
TEST(Layouts, BiasGradientOfBf16Input) {
  for (const char* layout : {"nhwc", "nChw16c", ""}) {
    const std::int64_t n = 3, ch = 32, h = 5, w = 7, sp = h * w;
    Tensor plain = Tensor::empty({n, ch, h, w});
    CounterRng(12).fill_normal(plain, 0, 0.0f, 1.0f);
    ir::Graph g;
    ir::Value* dy = ops::input(g, "dy", {n, ch, h, w});
    dy->set_layout(layout);
    dy->set_stored(DType::BF16);
    ir::Value* db = g.add_node(ops::op("bias_add_bwd"), {dy})->output();
    g.add_output(db);
    runtime::Executable exe(g);
    Tensor in = exe.input("dy");
    ASSERT_EQ(in.dtype(), DType::BF16);
    ASSERT_EQ(in.nbytes(), static_cast<std::size_t>(n * ch * sp * 2));
    auto* stored = static_cast<std::uint16_t*>(in.raw());
    const std::string l = layout;
    const std::int64_t block = l == "nhwc" ? ch : ir::channel_block(l);
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t c = 0; c < ch; ++c)
        for (std::int64_t s = 0; s < sp; ++s) {
          const std::int64_t at =
              block == 1 ? (i * ch + c) * sp + s
                         : ((i * (ch / block) + c / block) * sp + s) * block + c % block;
          stored[at] = to_bf16(plain.at((i * ch + c) * sp + s));
        }
    exe.run();
    EXPECT_NE(exe.kernel_table().find("native bf16"), std::string::npos) << exe.kernel_table();
    for (std::int64_t c = 0; c < ch; ++c) {
      double want = 0.0;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t s = 0; s < sp; ++s)
          want += from_bf16(to_bf16(plain.at((i * ch + c) * sp + s)));
      EXPECT_NEAR(exe.value(db).at(c), want, 1e-4) << "'" << layout << "' channel " << c;
    }
  }
}

#if MINIDL_WITH_ONEDNN
namespace {
/// max |a - b| / max |b| over a tensor: bf16's errors are relative to a tensor's scale.
double scaled_difference(const Tensor& a, const Tensor& b) {
  double diff = 0.0, scale = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(double(a.at(i)) - b.at(i)));
    scale = std::max(scale, std::abs(double(b.at(i))));
  }
  return scale > 0.0 ? diff / scale : diff;
}
}  // namespace

// --precision bf16 on the CNN: the activations between the bf16 convolutions, their pooling and
// the ReLU backward are stored as bf16 in the layout the bf16 convolutions want; the flatten's
// input as bf16 too, plain (the pooling writes what the linear layer's shared copy would have:
// the copy is folded into it); the input image, parameters, their gradients and the loss stay
// f32. The memory plan holds those values in half the bytes, the kernel table names the bf16
// kernels, and loss and gradients stay near the f32 run's.
TEST(Layouts, Bf16ValuesBetweenBf16Kernels) {
  if (std::string why = ops::bf16_unavailable(); !why.empty()) GTEST_SKIP() << "bf16 " << why;
  const std::string& bf16 = ops::bf16_layout();
  if (bf16.empty()) GTEST_SKIP() << "oneDNN's bf16 convolutions use no layout minidl names here";
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = small_cnn();
  model->reset(5);
  TrainingGraph f32(*model, batch);
  TrainingGraph mixed(*model, batch);
  ops::MixedPrecision(ir::Precision::BF16).run(mixed.g);  // the trainer's order
  for (TrainingGraph* t : {&f32, &mixed}) {
    ops::FuseBiasActivation().run(t->g);
    ops::PropagateLayouts(ir::Backend::OneDnn).run(t->g);
  }
  const ir::Graph& g = mixed.g;
  auto stored = [&](std::string_view node, int output = 0) {
    const ir::Node* n = g.find(node);
    return n ? n->output(output)->stored() : DType::I64;
  };
  // In bf16, in the bf16 convolutions' layout: the convolutions' outputs, the pooling between
  // them, the ReLU backward and the data gradient between them.
  for (const char* node :
       {"conv1.conv2d+bias+relu", "pool1.max_pool2d", "conv2.conv2d+bias+relu", "relu2.relu.bwd",
        "conv2.conv2d.bwd", "pool2.max_pool2d.bwd", "relu1.relu.bwd"}) {
    EXPECT_EQ(stored(node), DType::BF16) << node << "\n" << ir::to_text(g);
    EXPECT_EQ(layout_of(g, node), bf16) << node;
  }
  // The flatten's input: bf16, plain, read by the linear layer's two products through the
  // flatten, with no copy between.
  EXPECT_EQ(stored("pool2.max_pool2d"), DType::BF16);
  EXPECT_EQ(layout_of(g, "pool2.max_pool2d"), "");
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == "bf16_copy") {
      EXPECT_NE(n->input(0)->producer()->op(), "flatten") << n->describe();
    }
  }
  // f32: the input image, the loss and the gradients (graph outputs), the parameters.
  EXPECT_EQ(stored("pool1.max_pool2d", 1), DType::I32);
  // Max pooling's argmax, between two poolings on bf16 values, in their layout; pool2's, whose
  // output is plain before the flatten, plain like that output (its kernels then transpose
  // a group at a time between x's layout and the plain values).
  EXPECT_EQ(layout_of(g, "pool1.max_pool2d", 1), bf16);
  EXPECT_EQ(layout_of(g, "pool2.max_pool2d", 1), "");
  EXPECT_EQ(stored("x"), DType::F32);
  for (const ir::Value* v : g.outputs()) EXPECT_EQ(v->stored(), DType::F32) << v->ref();
  for (const ir::Node* n : g.nodes())
    if (n->def().is_source()) {
      EXPECT_EQ(n->output()->stored(), n->output()->dtype());
    }
  EXPECT_THAT(ir::to_text(g), HasSubstr("(stored bf16)"));

  runtime::Executable f32_exe(f32.g, {.backend = ir::Backend::OneDnn});
  runtime::Executable mixed_exe(g, {.backend = ir::Backend::OneDnn});
  // Without reuse, the plan is smaller by half of each bf16 activation's bytes and larger by the
  // bf16 copies the linear layers' products share (ops::share_bf16_factors), each rounded to the
  // buffers' alignment, at most 64 bytes apart per value.
  std::size_t halved = 0, copies = 0, count = 0;
  for (const ir::Node* n : g.nodes())
    for (const ir::Value* v : n->outputs()) {
      // An alias (the flatten) has no buffer of its own.
      if (v->stored() != DType::BF16 || n->def().is_alias()) continue;
      ++count;
      (n->op() == "bf16_copy" ? copies : halved) += v->shape().numel() * 2;
    }
  ASSERT_GT(count, 0u);
  EXPECT_GT(copies, 0u);
  const std::size_t saved = f32_exe.memory().naive_bytes + copies - mixed_exe.memory().naive_bytes;
  EXPECT_GE(saved + 64 * count, halved);
  EXPECT_LE(saved, halved + 64 * count);
  // The kernel table names the kernels that read or write bf16: oneDNN's ReLU backward, the
  // native pooling (declared preferred) and bias gradient.
  const std::string table = mixed_exe.kernel_table();
  EXPECT_THAT(table, HasSubstr("max_pool2d_bwd 'pool1.max_pool2d.bwd'"));
  for (const auto& [kernel, label] : {std::pair{"relu2.relu.bwd' (%", "-> onednn bf16"},
                                      std::pair{"pool1.max_pool2d' (%", "-> native bf16"}}) {
    const std::size_t at = table.find(kernel);
    ASSERT_NE(at, std::string::npos) << kernel << "\n" << table;
    const std::string line = table.substr(at, table.find('\n', at) - at);
    EXPECT_THAT(line, HasSubstr(label)) << line;
  }
  EXPECT_THAT(table, HasSubstr("-> native bf16"));  // bias_add_bwd

  // Near the f32 run. Each product rounds its factors to bf16 (8 significant bits: 2^-9
  // relative) and each stored activation and activation gradient is rounded once more, so the
  // errors grow along the chain of bf16 values: measured on an AMX CPU, the loss 0.13% off, the
  // gradients 0.1-0.4% of their scale, the first convolution's weight gradient (the end of the
  // longest chain, a sum with cancellations) 2.2%. The bounds, 1% for the loss and 5% of a
  // gradient's scale, leave room for another CPU's kernels and still fail for a wrong layout or
  // type (errors of the order of the values); the run must differ from f32 (bf16 did happen).
  f32_exe.run();
  mixed_exe.run();
  double largest = 0.0;
  for (std::size_t i = 0; i < g.outputs().size(); ++i) {
    const double d =
        scaled_difference(mixed_exe.value(g.outputs()[i]), f32_exe.value(f32.g.outputs()[i]));
    EXPECT_LT(d, i == 0 ? 1e-2 : 5e-2) << "output " << i << (i == 0 ? " (the loss)" : "");
    largest = std::max(largest, d);
  }
  EXPECT_GT(largest, 1e-4);
  RecordProperty("largest_scaled_difference", std::to_string(largest));
}

// The linear layer's shared bf16 copy of the flatten's input, folded into the pooling that makes
// that input, gives the copy's bits: the same CNN with the pooling's output also a graph output
// (an outside reader, so the copy stays) computes the same loss and gradients, bit for bit.
TEST(Layouts, FoldedBf16CopyGivesTheCopysBits) {
  if (std::string why = ops::bf16_unavailable(); !why.empty()) GTEST_SKIP() << "bf16 " << why;
  if (ops::bf16_layout().empty())
    GTEST_SKIP() << "oneDNN's bf16 convolutions use no layout minidl names here";
  const Dataset batch = minidl::testing::blobs(8, 3);
  auto model = small_cnn();
  model->reset(5);
  TrainingGraph folded(*model, batch);
  TrainingGraph kept(*model, batch);
  const std::size_t outputs = folded.g.outputs().size();
  kept.g.add_output(kept.g.find("pool2.max_pool2d")->output(0));
  auto copies_of_flatten = [](const ir::Graph& g) {
    int n = 0;
    for (const ir::Node* c : g.nodes())
      n += c->op() == "bf16_copy" && c->input(0)->producer()->op() == "flatten";
    return n;
  };
  for (TrainingGraph* t : {&folded, &kept}) {
    ops::MixedPrecision(ir::Precision::BF16).run(t->g);
    ops::FuseBiasActivation().run(t->g);
    ops::PropagateLayouts(ir::Backend::OneDnn).run(t->g);
  }
  EXPECT_EQ(copies_of_flatten(folded.g), 0) << ir::to_text(folded.g);
  EXPECT_EQ(copies_of_flatten(kept.g), 1) << ir::to_text(kept.g);
  EXPECT_EQ(folded.g.find("pool2.max_pool2d")->output(0)->stored(), DType::BF16);
  const std::vector<Tensor> want = kept.run(ir::Backend::OneDnn);
  const std::vector<Tensor> got = folded.run(ir::Backend::OneDnn);
  for (std::size_t i = 0; i < outputs; ++i) {
    ASSERT_EQ(want[i].nbytes(), got[i].nbytes());
    EXPECT_EQ(std::memcmp(want[i].raw(), got[i].raw(), got[i].nbytes()), 0)
        << "output " << i << (i == 0 ? " (the loss)" : "");
  }
}
#endif

// ---- BatchNorm ------------------------------------------------------------------------------

namespace {

/// The [N,C,H,W] tensor p stored in `layout` (element (n,c,s) at ((n*C/B + c/B)*S + s)*B + c%B).
void store(const Tensor& p, const std::string& layout, float* out) {
  const Shape& s = p.shape();
  const std::int64_t n = s[0], ch = s[1], sp = s[2] * s[3], block = ir::channel_block(layout);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t c = 0; c < ch; ++c)
      for (std::int64_t j = 0; j < sp; ++j)
        out[((i * (ch / block) + c / block) * sp + j) * block + c % block] =
            p.at((i * ch + c) * sp + j);
}
/// The element (n, c, s) of t stored in `layout`, by its plain index.
float load(const Tensor& t, const std::string& layout, std::int64_t plain_index) {
  const Shape& s = t.shape();
  const std::int64_t ch = s[1], sp = s[2] * s[3], block = ir::channel_block(layout);
  const std::int64_t i = plain_index / (ch * sp), c = plain_index / sp % ch, j = plain_index % sp;
  return t.at(((i * (ch / block) + c / block) * sp + j) * block + c % block);
}

}  // namespace

// Every BatchNorm kernel that touches an activation (bn_stats, bn_stats_bwd, batch_norm,
// batch_norm_bwd, batch_norm_bwd_reduce, batch_norm_bwd_data; native and oneDNN) reads and writes
// it in its layout: blocked, plain, or one of each, against an all-plain graph; the fused
// backward ops give what batch_norm_bwd and bn_stats_bwd give.
TEST(Layouts, BatchNormKernelsOfBlockedValues) {
  const Shape shape{3, 32, 4, 5};
  const std::int64_t ch = 32;
  Tensor x = Tensor::empty(shape), dy = Tensor::empty(shape), w = Tensor::empty({ch});
  Tensor b = Tensor::empty({ch}), dstats = Tensor::empty({3, ch});
  const CounterRng rng(9);
  rng.fill_normal(x, 0, 0.5f, 2.0f);
  rng.fill_normal(dy, 1, 0.0f, 1.0f);
  rng.fill_uniform(w, 2, 0.5f, 1.5f);
  rng.fill_uniform(b, 3, -1.0f, 1.0f);
  rng.fill_uniform(dstats, 4, -1.0f, 1.0f);
  std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
  backends.push_back(ir::Backend::OneDnn);
#endif
  struct Layouts {
    std::string x, dy, out;  // out: y's and both dx's
  };
  const std::vector<Layouts> layouts = {{"", "", ""},
                                        {"nChw16c", "nChw16c", "nChw16c"},
                                        {"nChw8c", "nChw8c", "nChw8c"},
                                        {"nChw16c", "nChw16c", ""},
                                        {"", "", "nChw8c"},
                                        {"nChw16c", "", "nChw8c"},
                                        {"", "nChw8c", "nChw16c"}};
  std::vector<Tensor> want;
  for (ir::Backend backend : backends) {
    for (const Layouts& l : layouts) {
      SCOPED_TRACE(
          fmt::format("{} x '{}' dy '{}' y/dx '{}'", ir::backend_name(backend), l.x, l.dy, l.out));
      ir::Graph g;
      ir::Value* xv = ops::input(g, "x", shape);
      ir::Value* dyv = ops::input(g, "dy", shape);
      xv->set_layout(l.x);
      dyv->set_layout(l.dy);
      ir::Value* stats = ops::bn_stats(xv);
      auto [mean, var] = ops::bn_moments(stats);
      ir::Value* wv = ops::parameter(g, "w", w);
      ir::Value* y = ops::batch_norm(xv, mean, var, wv, ops::parameter(g, "b", b));
      ir::Node* bwd = g.add_node(ops::op("batch_norm_bwd"), {dyv, xv, mean, var, wv});
      ir::Value* dsv = ops::parameter(g, "ds", dstats);
      ir::Value* sdx = g.add_node(ops::op("bn_stats_bwd"), {xv, dsv})->output();
      ir::Node* red = g.add_node(ops::op("batch_norm_bwd_reduce"), {dyv, xv, mean, var, wv});
      ir::Value* fdx =
          g.add_node(ops::op("batch_norm_bwd_data"), {dyv, xv, var, dsv, wv})->output();
      y->set_layout(l.out);
      bwd->output(0)->set_layout(l.out);
      sdx->set_layout(l.out);
      fdx->set_layout(l.out);
      const std::vector<ir::Value*> outs{stats,
                                         y,
                                         bwd->output(0),
                                         bwd->output(1),
                                         bwd->output(2),
                                         bwd->output(3),
                                         bwd->output(4),
                                         sdx,
                                         red->output(0),
                                         red->output(1),
                                         red->output(2),
                                         red->output(3),
                                         fdx};
      for (ir::Value* v : outs) g.add_output(v);
      runtime::Executable exe(g, {.backend = backend});
      store(x, l.x, exe.input("x").data<float>());
      store(dy, l.dy, exe.input("dy").data<float>());
      exe.run();
      std::vector<Tensor> got;
      for (ir::Value* v : outs) {
        const Tensor& t = exe.value(v);
        Tensor plain = Tensor::empty(t.shape());
        for (std::int64_t i = 0; i < t.numel(); ++i)
          plain.data<float>()[i] = v->shape().rank() == 4 ? load(t, v->layout(), i) : t.at(i);
        got.push_back(std::move(plain));
      }
      auto near = [](float a, float b) { return std::fabs(a - b) <= 1e-4 * (1 + std::fabs(b)); };
      for (int k = 0; k < 4; ++k)
        for (std::int64_t c = 0; c < ch; ++c)
          ASSERT_PRED2(near, got[8 + k].at(c), got[3 + k].at(c)) << "reduce output " << k;
      for (std::int64_t i = 0; i < got[12].numel(); ++i)
        ASSERT_PRED2(near, got[12].at(i), got[2].at(i) + got[7].at(i)) << "dx element " << i;
      if (want.empty()) {
        want = std::move(got);
        continue;
      }
      for (std::size_t k = 0; k < outs.size(); ++k)
        for (std::int64_t i = 0; i < want[k].numel(); ++i)
          ASSERT_NEAR(got[k].at(i), want[k].at(i), 1e-4 * (1 + std::fabs(want[k].at(i))))
              << "output " << k << " element " << i;
    }
  }
}

// The fused backward ops masking dy by the ReLU's output y (activation relu, made by
// ops::FuseActivationBackward) against the unmasked ops on dz = (y > 0 ? dy : 0), what relu_bwd
// gives, with x, dy, y and the result each in its own layout. The data gradient is elementwise:
// the same bits in every case. The sums are too where dy and y share a layout; where they do
// not, the masked sums run over plain copies, which add a plane's elements in another grouping.
TEST(Layouts, MaskedBatchNormBackwardOfBlockedValues) {
  const Shape shape{3, 32, 4, 5};
  const std::int64_t ch = 32;
  Tensor x = Tensor::empty(shape), dy = Tensor::empty(shape), y = Tensor::empty(shape);
  Tensor dz = Tensor::empty(shape), w = Tensor::empty({ch}), dstats = Tensor::empty({3, ch});
  const CounterRng rng(12);
  rng.fill_normal(x, 0, 0.5f, 2.0f);
  rng.fill_normal(dy, 1, 0.0f, 1.0f);
  rng.fill_normal(y, 2, 0.0f, 1.0f);
  rng.fill_uniform(w, 3, 0.5f, 1.5f);
  rng.fill_uniform(dstats, 4, -1.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); i += 7) y.data<float>()[i] = 0.0f;  // the kink: masked
  for (std::int64_t i = 0; i < y.numel(); ++i) dz.data<float>()[i] = y.at(i) > 0 ? dy.at(i) : 0;
  struct Layouts {
    std::string x, dy, y, out;
  };
  const std::vector<Layouts> layouts = {{"", "", "", ""},
                                        {"nChw16c", "nChw16c", "nChw16c", "nChw16c"},
                                        {"nChw8c", "nChw8c", "nChw8c", "nChw8c"},
                                        {"nChw16c", "nChw16c", "nChw16c", ""},
                                        {"nChw16c", "", "", "nChw8c"},
                                        {"nChw16c", "nChw16c", "", ""},
                                        {"", "", "nChw8c", "nChw16c"}};
  for (const Layouts& l : layouts) {
    SCOPED_TRACE(fmt::format("x '{}' dy '{}' y '{}' dx '{}'", l.x, l.dy, l.y, l.out));
    ir::Graph g;
    ir::Value* xv = ops::input(g, "x", shape);
    ir::Value* dyv = ops::input(g, "dy", shape);
    ir::Value* yv = ops::input(g, "y", shape);
    ir::Value* dzv = ops::input(g, "dz", shape);
    xv->set_layout(l.x);
    dyv->set_layout(l.dy);
    dzv->set_layout(l.dy);
    yv->set_layout(l.y);
    auto [mean, var] = ops::bn_moments(ops::bn_stats(xv));
    ir::Value* wv = ops::parameter(g, "w", w);
    ir::Value* dsv = ops::parameter(g, "ds", dstats);
    const ir::Attrs relu{{"activation", std::string("relu")}};
    ir::Node* red_m =
        g.add_node(ops::op("batch_norm_bwd_reduce"), {dyv, xv, mean, var, wv, yv}, relu);
    ir::Node* red_u = g.add_node(ops::op("batch_norm_bwd_reduce"), {dzv, xv, mean, var, wv});
    ir::Value* dx_m =
        g.add_node(ops::op("batch_norm_bwd_data"), {dyv, xv, var, dsv, wv, yv}, relu)->output();
    ir::Value* dx_u = g.add_node(ops::op("batch_norm_bwd_data"), {dzv, xv, var, dsv, wv})->output();
    dx_m->set_layout(l.out);
    dx_u->set_layout(l.out);
    for (int o = 0; o < 4; ++o) {
      g.add_output(red_m->output(o));
      g.add_output(red_u->output(o));
    }
    g.add_output(dx_m);
    g.add_output(dx_u);
    runtime::Executable exe(g, {.backend = ir::Backend::Native});
    store(x, l.x, exe.input("x").data<float>());
    store(dy, l.dy, exe.input("dy").data<float>());
    store(dz, l.dy, exe.input("dz").data<float>());
    store(y, l.y, exe.input("y").data<float>());
    exe.run();
    const bool same_path = l.y == l.dy;
    for (int o = 0; o < 4; ++o) {
      const Tensor& got = exe.value(red_m->output(o));
      const Tensor& want = exe.value(red_u->output(o));
      for (std::int64_t c = 0; c < ch; ++c) {
        if (same_path) {
          ASSERT_EQ(got.at(c), want.at(c)) << "reduce output " << o << " channel " << c;
        } else {
          ASSERT_NEAR(got.at(c), want.at(c), 1e-5 * (1 + std::fabs(want.at(c))))
              << "reduce output " << o << " channel " << c;
        }
      }
    }
    const Tensor& got = exe.value(dx_m);
    const Tensor& want = exe.value(dx_u);
    for (std::int64_t i = 0; i < got.numel(); ++i)
      ASSERT_EQ(load(got, l.out, i), load(want, l.out, i)) << "dx element " << i;
  }
}

#if MINIDL_WITH_ONEDNN
// conv -> BatchNorm -> relu, twice, then pooling and a linear layer.
std::unique_ptr<nn::Sequential> batch_norm_network() {
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>("conv1", 1, 16, 3, 1, 1, nn::Init::He);
  model->emplace<nn::BatchNorm2d>("bn1", 16);
  model->emplace<nn::ReLU>("relu1");
  model->emplace<nn::Conv2d>("conv2", 16, 16, 3, 1, 1, nn::Init::He);
  model->emplace<nn::BatchNorm2d>("bn2", 16);
  model->emplace<nn::ReLU>("relu2");
  model->emplace<nn::MaxPool2d>("pool", 4);
  model->emplace<nn::Flatten>("flatten");
  model->emplace<nn::Linear>("fc", 16 * 2 * 2, 10, nn::Init::Xavier);
  model->reset(5);
  return model;
}

// The blocked run's loss and gradients (got) are the plain one's (want), to rounding.
template <typename Outputs>
void expect_same_outputs(const Outputs& want, const Outputs& got) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    for (std::int64_t j = 0; j < want[i].numel(); ++j) {
      const float a = want[i].at(j), b = got[i].at(j);
      EXPECT_NEAR(a, b, 2e-4f * (1.0f + std::abs(a))) << "output " << i << " element " << j;
    }
  }
}

// conv -> BatchNorm -> relu -> conv, training: with --backend onednn the activations stay blocked
// through the BatchNorm forward and backward, and the loss and gradients are the plain graph's.
TEST(Layouts, BatchNormKeepsTheBlockedLayoutBetweenConvolutions) {
  const std::string& blocked = ops::blocked_layout();
  if (blocked.empty()) GTEST_SKIP() << "oneDNN uses no channel-blocked layout on this CPU";
  const Dataset batch = minidl::testing::blobs(8, 3);
  const std::unique_ptr<nn::Sequential> model = batch_norm_network();
  TrainingGraph plain(*model, batch);
  TrainingGraph propagated(*model, batch);
  ops::FuseBiasActivation().run(plain.g);
  ops::FuseBiasActivation().run(propagated.g);
  ASSERT_TRUE(ops::PropagateLayouts(ir::Backend::OneDnn).run(propagated.g));
  const ir::Graph& g = propagated.g;
  // Each relu is folded into its BatchNorm (ops::FuseBiasActivation); relu_bwd reads the result.
  for (const char* node : {"conv1.conv2d+bias", "bn1.batch_norm+relu", "conv2.conv2d+bias",
                           "bn2.batch_norm+relu", "relu2.relu.bwd", "bn2.batch_norm.bwd",
                           "relu1.relu.bwd", "bn1.batch_norm.bwd", "conv2.conv2d.bwd"}) {
    EXPECT_EQ(layout_of(g, node), blocked) << node << "\n" << ir::to_text(g);
  }
  // The kernels that read them are the BatchNorm ones, oneDNN's where it has one.
  for (const ir::Node* n : g.nodes()) {
    if (n->op() != "batch_norm" && n->op() != "batch_norm_bwd") continue;
    EXPECT_EQ(n->kernel(ir::Backend::OneDnn)->kernel->backend, ir::Backend::OneDnn)
        << n->describe();
  }
  expect_same_outputs(plain.run(ir::Backend::Native), propagated.run(ir::Backend::OneDnn));
}

// Under bf16 the network's activations stay f32 (BatchNorm between the convolutions reads and
// writes f32), so they keep the blocked f32 layout: the bf16 copies of the input and of the
// weights two convolutions share, and of the linear layer's factors (ops::share_bf16_factors),
// are plain values stored as bf16, not bf16 activations, and leave the layouts alone (counted as
// bf16 activations, they would keep every node reading one, and so the whole network, plain).
TEST(Layouts, SharedBf16CopiesLeaveTheBlockedLayoutAlone) {
  const std::string& blocked = ops::blocked_layout();
  if (blocked.empty()) GTEST_SKIP() << "oneDNN uses no channel-blocked layout on this CPU";
  if (const std::string why = ops::bf16_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const Dataset batch = minidl::testing::blobs(8, 3);
  const std::unique_ptr<nn::Sequential> model = batch_norm_network();
  TrainingGraph mixed(*model, batch);
  ir::Graph& g = mixed.g;
  ops::MixedPrecision(ir::Precision::BF16).run(g);
  ops::FuseBiasActivation().run(g);
  ops::PropagateLayouts(ir::Backend::OneDnn).run(g);
  std::vector<std::string> copied;
  for (const ir::Node* n : g.nodes()) {
    if (n->op() != "bf16_copy") continue;
    EXPECT_EQ(n->output()->stored(), DType::BF16) << n->describe();
    EXPECT_EQ(n->output()->layout(), "") << n->describe();
    copied.push_back(n->input(0)->producer()->name());
  }
  EXPECT_THAT(copied, ::testing::Contains("x")) << ir::to_text(g);
  EXPECT_THAT(copied, ::testing::Contains("conv2.weight")) << ir::to_text(g);
  for (const char* node : {"conv1.conv2d+bias", "bn1.batch_norm+relu", "conv2.conv2d+bias",
                           "bn2.batch_norm+relu", "bn2.batch_norm.bwd", "conv2.conv2d.bwd"}) {
    EXPECT_EQ(layout_of(g, node), blocked) << node << "\n" << ir::to_text(g);
    EXPECT_EQ(g.find(node)->output(0)->stored(), DType::F32) << node;
  }
}

// The same network with BatchNorm's backward fused (ops::FuseBatchNormBackward): the fused data
// op's values stay blocked, and the loss and gradients are the plain unfused graph's.
TEST(Layouts, FusedBatchNormBackwardKeepsTheBlockedLayout) {
  const std::string& blocked = ops::blocked_layout();
  if (blocked.empty()) GTEST_SKIP() << "oneDNN uses no channel-blocked layout on this CPU";
  const Dataset batch = minidl::testing::blobs(8, 3);
  const std::unique_ptr<nn::Sequential> model = batch_norm_network();
  TrainingGraph plain(*model, batch);
  TrainingGraph fused(*model, batch);
  ops::FuseBiasActivation().run(plain.g);
  ops::FuseBiasActivation().run(fused.g);
  ASSERT_TRUE(ops::FuseBatchNormBackward().run(fused.g));
  ASSERT_TRUE(ops::PropagateLayouts(ir::Backend::OneDnn).run(fused.g));
  const ir::Graph& g = fused.g;
  int seen = 0;
  for (const ir::Node* n : g.nodes()) {
    ASSERT_NE(n->op(), "batch_norm_bwd");
    ASSERT_NE(n->op(), "bn_stats_bwd");
    if (n->op() != "batch_norm_bwd_data") continue;
    ++seen;
    EXPECT_EQ(n->input(0)->layout(), blocked) << n->describe() << "\n" << ir::to_text(g);
    EXPECT_EQ(n->input(1)->layout(), blocked) << n->describe();
    EXPECT_EQ(n->output(0)->layout(), blocked) << n->describe();
  }
  EXPECT_EQ(seen, 2);
  expect_same_outputs(plain.run(ir::Backend::Native), fused.run(ir::Backend::OneDnn));
}
#endif
