// The pass that runs each optimizer update as soon as its inputs allow: where the updates go, and
// that training is unchanged to the bit.
#include <gtest/gtest.h>

#include <unordered_map>

#include "../support/modules.hpp"
#include "../support/same_bits.hpp"
#include "../support/synthetic.hpp"
#include "../support/training_graph.hpp"
#include "minidl/ir/pass.hpp"
#include "minidl/ir/printer.hpp"

using namespace minidl;
using minidl::testing::SgdStep;

namespace {

bool is_update(const ir::Node* n) { return n->op() == "sgd_momentum"; }

}  // namespace

TEST(UpdatesWhenReady, RunsEachUpdateOnceItsGradientAndTheParameterReadersAreDone) {
  auto model = minidl::testing::small_mlp();
  model->reset(3);
  SgdStep step(*model, minidl::testing::blobs(16, 3), 0.0, 0.9);
  const std::size_t nodes = step.g.nodes().size();
  ASSERT_TRUE(ir::UpdatesWhenReady().run(step.g));
  ASSERT_EQ(step.g.nodes().size(), nodes);

  std::unordered_map<const ir::Node*, std::size_t> at;
  for (std::size_t i = 0; i < step.g.nodes().size(); ++i) at[step.g.nodes()[i]] = i;
  std::size_t updates = 0;
  for (const ir::Node* u : step.g.nodes()) {
    if (!is_update(u)) continue;
    ++updates;
    // The latest of what it waits for: its inputs' producers and the parameter's other readers.
    std::size_t ready = 0;
    for (const ir::Value* in : u->inputs()) ready = std::max(ready, at.at(in->producer()));
    for (const ir::Node* reader : u->input(0)->users())
      if (reader != u) ready = std::max(ready, at.at(reader));
    // Between that and the update only other updates run.
    for (std::size_t i = ready + 1; i < at.at(u); ++i)
      EXPECT_TRUE(is_update(step.g.nodes()[i]))
          << step.g.nodes()[i]->describe() << " runs before " << u->describe() << "\n"
          << ir::to_text(step.g);
  }
  EXPECT_EQ(updates, 4u);  // two layers' weights and biases
  // The last layer's weight is updated before the first layer's weight gradient is made.
  const ir::Node* fc2_update = nullptr;
  for (const ir::Node* n : step.g.nodes())
    if (is_update(n) && n->name().starts_with("fc2.weight")) fc2_update = n;
  ASSERT_NE(fc2_update, nullptr) << ir::to_text(step.g);
  const ir::Node* fc1_update = nullptr;
  for (const ir::Node* n : step.g.nodes())
    if (is_update(n) && n->name().starts_with("fc1.weight")) fc1_update = n;
  ASSERT_NE(fc1_update, nullptr);
  EXPECT_LT(at.at(fc2_update), at.at(fc1_update->input(1)->producer())) << ir::to_text(step.g);

  // Already in place: nothing moves.
  EXPECT_FALSE(ir::UpdatesWhenReady().run(step.g));
}

TEST(UpdatesWhenReady, TrainsToTheSameBits) {
  const Dataset batch = minidl::testing::blobs(16, 3);
  auto plain_model = minidl::testing::small_mlp();
  auto early_model = minidl::testing::small_mlp();
  plain_model->reset(5);
  early_model->reset(5);
  SgdStep plain(*plain_model, batch, 0.0, 0.9), early(*early_model, batch, 0.0, 0.9);
  ASSERT_TRUE(ir::UpdatesWhenReady().run(early.g));
  runtime::Executable plain_exe(plain.g), early_exe(early.g);
  for (int s = 0; s < 5; ++s) {
    plain_exe.run();
    early_exe.run();
  }
  EXPECT_TRUE(minidl::testing::same_bits(plain_model->parameters(), early_model->parameters()));
}
