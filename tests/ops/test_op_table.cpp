// Every op in the table (ops/'s and parallel's) is complete: a shape rule, a native kernel (unless
// it is a source or an alias), a gradient rule or a stated reason for none, and a test that
// covers it.
#include <gtest/gtest.h>

#include "harness.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/op_table.hpp"

using namespace minidl;

TEST(OpTable, EveryOpIsComplete) {
  parallel::register_ops();  // the collectives' table, parallel's own
  for (const ir::OpDef* d : parallel::op_table()) EXPECT_EQ(ops::find_op(d->name()), d);
  const std::set<std::string> covered = minidl::testing::ops_covered_by_tests();
  const auto all = ops::all_ops();
  ASSERT_GT(all.size(), 15u);
  for (const ir::OpDef* d : all) {
    SCOPED_TRACE(d->name());
    EXPECT_NE(d->infer_fn(), nullptr) << "no shape rule";
    EXPECT_TRUE(d->has_grad_rule()) << "neither .grad(...) nor .no_grad(\"why\")";
    if (d->is_source()) continue;
    if (!d->is_alias()) {
      bool native = false;
      for (const auto& k : d->kernels()) native |= k.backend == ir::Backend::Native;
      EXPECT_TRUE(native) << "no native kernel";
    }
    EXPECT_TRUE(covered.count(d->name())) << "no MINIDL_OP_TEST covers this op";
  }
}

TEST(OpTable, UnknownOpListsTheKnownOnes) {
  try {
    ops::op("gelu_typo");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown op 'gelu_typo'; known ops: "), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos);
  }
}
