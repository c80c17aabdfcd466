// ops::register_op, the way an application adds its own op (examples/custom_layer.cpp): it
// refuses an op that could not run or be differentiated, naming the op and what is missing.
// Only refusals here: a registered op would stay in the table for every later test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

using namespace minidl;
using ::testing::HasSubstr;

namespace {

void copy_native(const ir::KernelArgs& k) {
  ops::map_unary(k, [](float x) { return x; });
}
void no_grad_rule(ir::GradCtx&) {}

std::string refusal(const ir::OpDef& def) {
  try {
    ops::register_op(def);
  } catch (const Error& e) {
    return e.what();
  }
  return "(registered)";
}

}  // namespace

TEST(Registry, RefusesATakenName) {
  const ir::OpDef def = ir::OpDef("relu")
                            .inputs({"x"})
                            .infer(ops::infer_unary_f32)
                            .kernel(ir::Backend::Native, copy_native)
                            .grad(no_grad_rule);
  EXPECT_THAT(refusal(def), HasSubstr("op 'relu' is already registered"));
}

TEST(Registry, RefusesAnIncompleteOp) {
  const ir::OpDef no_infer = ir::OpDef("test_registry_no_infer")
                                 .inputs({"x"})
                                 .kernel(ir::Backend::Native, copy_native)
                                 .grad(no_grad_rule);
  EXPECT_THAT(refusal(no_infer), HasSubstr("op 'test_registry_no_infer' has no shape rule"));
  const ir::OpDef no_kernel = ir::OpDef("test_registry_no_kernel")
                                  .inputs({"x"})
                                  .infer(ops::infer_unary_f32)
                                  .grad(no_grad_rule);
  EXPECT_THAT(refusal(no_kernel), HasSubstr("op 'test_registry_no_kernel' has no native kernel"));
  const ir::OpDef no_grad = ir::OpDef("test_registry_no_grad")
                                .inputs({"x"})
                                .infer(ops::infer_unary_f32)
                                .kernel(ir::Backend::Native, copy_native);
  EXPECT_THAT(refusal(no_grad), HasSubstr("op 'test_registry_no_grad' has no gradient rule"));
  EXPECT_EQ(ops::find_op("test_registry_no_grad"), nullptr);
}
