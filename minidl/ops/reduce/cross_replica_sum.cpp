// cross_replica_sum: y = the sum of x over every replica of the step — the thread replicas of
// this rank and every rank — which all read the same y. Models use it for statistics of the
// whole global batch (BatchNorm's running statistics; its batch statistics under --sync-bn).
//
// Written once per replica's forward (the model does not know the layout); the
// cross-replica-sums pass (parallel/cross_replica_sums.hpp) joins a rank's replica copies
// that share a `key` into one sum over its replicas and adds the reduction across ranks. A
// node the pass has not lowered (one replica, one rank) is a copy. Its gradient is the
// same sum of the output's gradient (every replica reads y), under the key "<key>.grad".
// A side effect: as any collective, every replica must reach it, read or not.
#include <algorithm>

#include "minidl/ops/common.hpp"
#include "minidl/ops/op_table.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {
namespace {

void infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input");
  MINIDL_CHECK_NODE(c, !c.attr<std::string>("key").empty(),
                    "the attribute 'key' must name the sum");
  c.set_output(0, c.input(0));
}

void copy_native(const ir::KernelArgs& k) {
  std::copy_n(k.in[0].data<float>(), k.in[0].numel(), k.out[0].data<float>());
}

void grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_cross_replica_sum, {g.out_grad(0)},
                           {{"key", g.attrs().get<std::string>("key") + ".grad"}}));
}

}  // namespace

MINIDL_OP(cross_replica_sum)
    .inputs({"x"})
    .attr<std::string>("key")
    .infer(infer)
    .side_effect()
    .kernel(ir::Backend::Native, copy_native)
    .grad(grad);

}  // namespace minidl::ops
