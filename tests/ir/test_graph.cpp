#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/ir/pass.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ir/verifier.hpp"
#include "minidl/ops/ops.hpp"

using namespace minidl;
using ::testing::HasSubstr;

TEST(Graph, ShapeErrorNamesNodeOpAndShapes) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {8, 784});
  ir::Value* w = ops::input(g, "w", {256, 700});
  ir::NameScope s(g, "fc1");
  try {
    ops::matmul(x, w, false, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("matmul 'fc1.matmul' (%"));
    EXPECT_THAT(e.what(), HasSubstr("inner dimensions differ: 784 vs 700"));
    EXPECT_THAT(e.what(), HasSubstr("a=[8,784] b=[256,700]"));
  }
}

TEST(Graph, NamesAreUnique) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 2});
  ir::Value* a = ops::relu(x);
  ir::Value* b = ops::relu(a);
  EXPECT_EQ(a->producer()->name(), "relu");
  EXPECT_EQ(b->producer()->name(), "relu.1");
  EXPECT_EQ(g.find("relu.1"), b->producer());
}

// A node rebuilt in place of a removed one takes its name; a live node's name is not for taking.
TEST(Graph, ARebuiltNodeTakesTheRemovedNodesName) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 2});
  ir::Value* a = ops::relu(x);
  ir::Node* old = a->producer();
  ir::Node* rebuilt = ops::relu(x)->producer();
  EXPECT_EQ(rebuilt->name(), "relu.1");
  EXPECT_DEATH(g.take_name(rebuilt, old), "is still in the graph");
  g.remove({old});
  g.take_name(rebuilt, old);
  EXPECT_EQ(rebuilt->name(), "relu");
  EXPECT_EQ(g.find("relu"), rebuilt);
}

TEST(Graph, WrongInputCountAndForeignValue) {
  ir::Graph g, h;
  ir::Value* x = ops::input(g, "x", {2, 2});
  ir::Value* y = ops::input(h, "y", {2, 2});
  EXPECT_THAT([&] { g.add_node(ops::op("add"), {x}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("expected 2 inputs (a, b), got 1")));
  EXPECT_THAT(
      [&] {
        g.add_node(ops::op("add"), {x, y});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("belongs to another graph")));
}

TEST(Verifier, CatchesUseBeforeDefinition) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 2});
  ir::Value* r = ops::relu(x);
  ir::Value* t = ops::tanh(x);
  ir::Value* s = ops::add(r, t);
  ir::verify(g);
  g.move_before(s->producer(), t->producer());
  EXPECT_THAT([&] { ir::verify(g); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is used before tanh 'tanh'")));
}

TEST(Verifier, CatchesInPlaceWriteBeforeARead) {
  ir::Graph g;
  Tensor pt = Tensor::zeros({4});
  ir::Value* p = ops::parameter(g, "p", pt);
  ir::Value* grad = ops::input(g, "g", {4});
  g.add_node(ops::op("sgd"), {p, grad, ops::input(g, "lr", {})}, {}, "update");
  ir::Value* late = ops::relu(p);  // reads p after the update overwrote it
  (void)late;
  EXPECT_THAT([&] { ir::verify(g); }, ::testing::ThrowsMessage<Error>(HasSubstr("overwrites %")));
}

TEST(Passes, DeadCodeEliminationKeepsOutputsAndSideEffects) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 2});
  ir::Value* used = ops::relu(x);
  ops::tanh(x);  // dead
  g.add_output(used);
  ir::PassManager pm;
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  EXPECT_TRUE(pm.run(g));
  EXPECT_EQ(g.find("tanh"), nullptr);
  EXPECT_NE(g.find("relu"), nullptr);
  EXPECT_FALSE(pm.run(g));
}

TEST(Printer, TextAndDot) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {2, 3});
  ir::Value* y = ops::scale(x, 2.0);
  g.add_output(y);
  const std::string text = ir::to_text(g);
  EXPECT_THAT(text, HasSubstr("= scale(%"));
  EXPECT_THAT(text, HasSubstr("alpha=2"));
  EXPECT_THAT(text, HasSubstr("-> [2,3] f32"));
  const std::string dot = ir::to_dot(g);
  EXPECT_THAT(dot, HasSubstr("digraph minidl"));
  EXPECT_THAT(dot, HasSubstr("->"));
}
