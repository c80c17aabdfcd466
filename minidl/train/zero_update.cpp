#include "minidl/train/zero_update.hpp"

#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/zero.hpp"
#include "minidl/train/step.hpp"

namespace minidl::train {

ir::Value* zero_update(ir::Graph& g, Model& model, optim::Optimizer& optimizer,
                       const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
                       const optim::StepInputs& in, const ZeroUpdate& z) {
  MINIDL_CHECK(z.comm != nullptr, "zero_update: no communicator");
  const parallel::ZeroPlan plan = zero_plan(model, z.comm->size());
  const parallel::ZeroOptions zo{.stage = z.stage,
                                 .rank = z.rank,
                                 .group = parallel::register_group(z.comm),
                                 .tree_leaves = z.tree_leaves,
                                 .reduced = z.reduced};
  const parallel::ZeroPieces pieces = parallel::zero_reduce_gradients(g, plan, zo, params, grads);
  // A program built as another rank (the preflight's) binds state of its own.
  const bool other = z.rank != z.comm->rank();
  NamedTensors own;
  if (other) own = optimizer.exchange_state({});
  optimizer.apply(g, pieces.names, pieces.params, pieces.grads, in);
  if (other) optimizer.exchange_state(std::move(own));
  std::vector<ir::Value*> updated;
  for (ir::Value* piece : pieces.params) {
    ir::Node* u = nullptr;
    for (ir::Node* user : piece->users())
      if (user->def().update_role() && user->input(user->def().update_role()->param) == piece)
        u = user;
    MINIDL_CHECK(u != nullptr, "--zero: the optimizer made no update of ", piece->ref());
    updated.push_back(optim::updated_param(u));
  }
  parallel::zero_gather_parameters(g, plan, zo, pieces, updated, params);
  if (!z.clip) return nullptr;
  std::vector<std::size_t> order;  // the updates' order without ZeRO: the parameters'
  for (ir::Value* p : params)
    order.push_back(static_cast<std::size_t>(plan.index(p->producer()->name())));
  return parallel::zero_sum_squares(g, plan, zo, pieces, order);
}

}  // namespace minidl::train
