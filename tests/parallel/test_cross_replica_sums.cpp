// --sync-bn's rewrite: readers of a value the model also sums across replicas read the sum.
#include <gtest/gtest.h>

#include "minidl/ops/op_table.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/cross_replica_sums.hpp"

using namespace minidl;

TEST(CrossReplicaSums, GlobalStatisticsReplaceTheLocalOnes) {
  ir::Graph g;
  ir::Value* x = ops::input(g, "x", {4, 3});
  ir::Value* local = ops::sum(x);
  ir::Value* shifted =
      ops::add(x, g.add_node(ops::op_expand, {local}, {{"shape", ir::Ints{4, 3}}})->output());
  // The model's sum for its running statistics, written after the local value's reader.
  ir::Value* global = ops::cross_replica_sum(local, "stats");
  g.add_output(shifted);
  g.add_output(global);
  EXPECT_EQ(parallel::use_global_statistics(g), 1);
  // The expand reads the sum now, and the sum moved before it.
  const ir::Node* expand = shifted->producer()->input(1)->producer();
  EXPECT_EQ(expand->input(0), global);
  const auto& order = g.nodes();
  EXPECT_LT(std::find(order.begin(), order.end(), global->producer()),
            std::find(order.begin(), order.end(), expand));
  EXPECT_EQ(local->users().size(), 1u);
  // Nothing left to redirect.
  EXPECT_EQ(parallel::use_global_statistics(g), 0);
}
