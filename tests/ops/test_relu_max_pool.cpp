// The relu-after-max-pool rewrite: max_pool2d(relu(x)) becomes relu(max_pool2d(x)) before
// autograd; after fusion the convolution keeps its bias, the relu folds into the pooling (and its
// backward into the pooling's backward), and the loss, the outputs and every gradient equal those
// of the graph without the rewrite (to rounding where oneDNN's convolution takes the bias in).
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/relu_max_pool.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;
using ir::Ints;

namespace {

const ir::Node* first_op(const ir::Graph& g, std::string_view op) {
  for (const ir::Node* n : g.nodes())
    if (n->op() == op) return n;
  return nullptr;
}

std::size_t count_op(const ir::Graph& g, std::string_view op) {
  return static_cast<std::size_t>(std::count_if(g.nodes().begin(), g.nodes().end(),
                                                [&](const ir::Node* n) { return n->op() == op; }));
}

Tensor normal(const Shape& s, std::uint64_t stream) {
  Tensor t = Tensor::empty(s);
  CounterRng(11).fill_normal(t, stream, 0.0f, 1.0f);
  return t;
}

// conv (3 -> 8, 3x3, pad 1) + bias -> relu -> max-pool `kernel`/`stride` -> loss sum(y * r),
// and its gradients with respect to x, the weight and the bias.
ir::Value* node(std::string_view op, std::vector<ir::Value*> in, ir::Attrs attrs,
                std::string name) {
  return ops::apply_node(op, std::move(in), std::move(attrs), std::move(name))->output(0);
}

struct Net {
  ir::Graph g;
  Tensor xt = normal({2, 3, 9, 9}, 1), wt = normal({8, 3, 3, 3}, 2), bt = normal({8}, 3), rt;
  std::vector<ir::Value*> checked;  // loss, pooled output, gradients
  Net(bool rewrite, bool fuse, Ints kernel, Ints stride) {
    ir::Value* x = ops::parameter(g, "x", xt);
    ir::Value* w = ops::parameter(g, "w", wt);
    ir::Value* b = ops::parameter(g, "b", bt);
    ir::Value* c = node("conv2d", {x, w}, {{"pad", Ints{1, 1}}}, "conv");
    ir::Value* r = node("relu", {node("bias_add", {c, b}, {}, "bias")}, {}, "relu");
    ir::Value* y = node("max_pool2d", {r}, {{"kernel", kernel}, {"stride", stride}}, "pool");
    rt = normal(y->shape(), 4);
    ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "r", rt)));
    if (rewrite) {
      EXPECT_TRUE(ops::ReluAfterMaxPool().run(g));
    }
    const std::vector<ir::Value*> grads = autograd::differentiate(g, loss, {x, w, b});
    if (fuse) {
      ops::FuseBiasActivation().run(g);
      ops::FuseActivationBackward().run(g);
    }
    // The pooled (and relu'd) value: the loss's product reads it.
    ir::Value* out = nullptr;
    for (ir::Node* n : g.nodes())
      if (n->op() == "mul" && n->phase() == ir::Phase::Forward) out = n->input(0);
    checked = {loss, out};
    checked.insert(checked.end(), grads.begin(), grads.end());
    for (ir::Value* v : checked) g.add_output(v);
  }
};

// Bit for bit, or (`exact` false) to rounding.
void expect_same_results(Net& want, Net& got, ir::Backend backend, bool exact = true) {
  runtime::Executable a(want.g, {.backend = backend});
  runtime::Executable b(got.g, {.backend = backend});
  a.run();
  b.run();
  ASSERT_EQ(want.checked.size(), got.checked.size());
  for (std::size_t i = 0; i < want.checked.size(); ++i) {
    const Tensor& ta = a.value(want.checked[i]);
    const Tensor& tb = b.value(got.checked[i]);
    ASSERT_EQ(ta.shape(), tb.shape());
    for (std::int64_t e = 0; e < ta.numel(); ++e) {
      if (exact) {
        ASSERT_EQ(ta.at(e), tb.at(e)) << "value " << i << " element " << e;  // +0 == -0
      } else {
        ASSERT_NEAR(ta.at(e), tb.at(e), 1e-5 * (1 + std::fabs(ta.at(e))))
            << "value " << i << " element " << e;
      }
    }
  }
}

}  // namespace

TEST(ReluAfterMaxPool, RewritesThenFusesAndKeepsResults) {
  for (const auto& [kernel, stride] : {std::pair<Ints, Ints>{{2, 2}, {2, 2}},     // disjoint
                                       std::pair<Ints, Ints>{{3, 3}, {1, 1}}}) {  // overlapping
    SCOPED_TRACE(fmt::format("kernel {} stride {}", kernel[0], stride[0]));
    Net plain(false, false, kernel, stride), rewritten(true, false, kernel, stride);
    Net fused_plain(false, true, kernel, stride), fused(true, true, kernel, stride);

    // Before fusion: the pooling reads the biased convolution, the relu reads the pooling.
    const ir::Node* relu = first_op(rewritten.g, "relu");
    ASSERT_NE(relu, nullptr) << ir::to_text(rewritten.g);
    EXPECT_EQ(relu->input(0)->producer()->op(), "max_pool2d");
    EXPECT_EQ(first_op(rewritten.g, "max_pool2d")->input(0)->producer()->op(), "bias_add");
    // The new nodes keep the old names.
    EXPECT_EQ(relu->name(), "relu");
    EXPECT_EQ(first_op(rewritten.g, "max_pool2d")->name(), "pool");
    // relu_bwd runs on the pooled shape now.
    for (const ir::Node* n : rewritten.g.nodes()) {
      if (n->op() == "relu_bwd") {
        EXPECT_EQ(n->output(0)->shape(), relu->output(0)->shape());
      }
    }

    // After fusion: conv+bias, and the pooling with the relu folded in.
    EXPECT_NE(fused.g.find("conv+bias"), nullptr) << ir::to_text(fused.g);
    EXPECT_EQ(count_op(fused.g, "relu"), 0u) << ir::to_text(fused.g);
    EXPECT_EQ(count_op(fused.g, "bias_add"), 0u);
    const ir::Node* pool = first_op(fused.g, "max_pool2d");
    ASSERT_NE(pool, nullptr) << ir::to_text(fused.g);
    EXPECT_EQ(pool->attrs().get<std::string>("activation"), "relu");
    // Its argmax carries the relu's mask: the pooling's backward reads the output gradient
    // itself, with no relu_bwd before it.
    EXPECT_EQ(count_op(fused.g, "relu_bwd"), 0u) << ir::to_text(fused.g);
    EXPECT_EQ(first_op(fused.g, "max_pool2d_bwd")->input(1), pool->output(1));
    // Without the rewrite the relu fuses into the convolution instead.
    EXPECT_NE(fused_plain.g.find("conv+bias+relu"), nullptr) << ir::to_text(fused_plain.g);

    std::vector<ir::Backend> backends{ir::Backend::Native};
#if MINIDL_WITH_ONEDNN
    backends.push_back(ir::Backend::OneDnn);
#endif
    for (const ir::Backend b : backends) {
      SCOPED_TRACE(ir::backend_name(b));
      expect_same_results(plain, rewritten, b);
      // oneDNN's convolution may round a bias it takes in otherwise than a separate bias_add
      // (its AVX2 kernel does): the same to rounding only.
      expect_same_results(plain, fused, b, b == ir::Backend::Native);
      expect_same_results(fused_plain, fused, b);
    }
  }
}

TEST(ReluAfterMaxPool, LeavesOtherReadersAndDisabledAlone) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", Shape{1, 2, 4, 4});
  ir::Value* r = ops::relu(x);
  ir::Value* y = ops::apply("max_pool2d", {r}, {{"kernel", Ints{2, 2}}}, 0);
  g.add_output(y);
  g.add_output(ops::sum(r));  // a second reader of the relu
  EXPECT_FALSE(ops::ReluAfterMaxPool().run(g));

  ir::Graph h;
  ir::Value* hx = ops::input(h, "x", Shape{1, 2, 4, 4});
  ir::Value* hr = ops::relu(hx);
  h.add_output(ops::apply("max_pool2d", {hr}, {{"kernel", Ints{2, 2}}}, 0));
  EXPECT_FALSE(ops::ReluAfterMaxPool(false).run(h));  // --no-fuse
  h.add_output(hr);                                   // the relu is a graph output
  EXPECT_FALSE(ops::ReluAfterMaxPool().run(h));
}

// A pooling whose argmax has a reader besides the pooling's backward (here a graph output) keeps
// its relu apart: the fused pooling would mark the clamped outputs' argmax with -1.
TEST(ReluAfterMaxPool, KeepsTheReluApartWhereArgmaxIsRead) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", Shape{1, 2, 4, 4});
  ir::Node* pool = ops::apply_node("max_pool2d", {x}, {{"kernel", Ints{2, 2}}}, "pool");
  g.add_output(ops::relu(pool->output(0)));
  g.add_output(pool->output(1));
  EXPECT_FALSE(ops::FuseBiasActivation().run(g)) << ir::to_text(g);
  EXPECT_EQ(count_op(g, "relu"), 1u);
  EXPECT_EQ(first_op(g, "max_pool2d")->attrs().get<std::string>("activation"), "none");
}
