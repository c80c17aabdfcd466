#include "minidl/parallel/collectives.hpp"

#include <mutex>

#include "minidl/ops/common.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::parallel {
namespace {

// src/dst [...] in place: dst = sum_ranks(scale * src). The scale is applied before the sum so
// that ranks with different shares of a batch weight their gradients by their share.
ir::Kernel make_allreduce(const ir::Node& node) {
  Communicator* comm = &group(static_cast<int>(node.attrs().get<std::int64_t>("group")));
  const float scale = node.attrs().get<float>("scale");
  return [comm, scale](const ir::KernelArgs& k) {
    float* x = k.out[0].data<float>();
    const std::int64_t n = k.out[0].numel();
    if (scale != 1.0f) {
      ops::elementwise(n, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) x[i] *= scale;
      });
    }
    comm->allreduce_sum(x, n);
  };
}

const ir::OpDef& allreduce_def() {
  static const ir::OpDef def = ir::OpDef("allreduce")
                                   .inputs({"x"})
                                   .attr<float>("scale", 1.0f)
                                   .attr<int>("group", 0)
                                   .infer(ops::infer_unary_f32)
                                   .kernel_factory(ir::Backend::Native, "mpi", make_allreduce)
                                   .inplace(0, 0)
                                   .no_grad("communication is inserted after differentiation");
  return def;
}

}  // namespace

void register_collective_ops() {
  static std::once_flag once;
  std::call_once(once, [] { ops::register_op(allreduce_def()); });
}

ir::Value* allreduce(ir::Value* x, double scale, int group, const std::string& name) {
  register_collective_ops();
  return x->graph()
      .add_node(allreduce_def(), {x}, {{"scale", scale}, {"group", std::int64_t{group}}}, name)
      ->output();
}

}  // namespace minidl::parallel
