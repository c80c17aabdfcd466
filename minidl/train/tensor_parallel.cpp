#include "minidl/train/tensor_parallel.hpp"

#include <algorithm>
#include <string>

namespace minidl::train {
namespace {

const Tensor* find(const NamedTensors& ts, const std::string& key) {
  const auto it = std::find_if(ts.begin(), ts.end(), [&](const auto& t) { return t.first == key; });
  return it == ts.end() ? nullptr : &it->second;
}

}  // namespace

void tensor_parallel_updates(ir::Graph& g, optim::Optimizer& optimizer,
                             const parallel::TensorParallelPlan& plan,
                             const parallel::TensorParallelOptions& o,
                             const std::vector<ir::Value*>& params,
                             const std::vector<ir::Value*>& grads, const optim::StepInputs& in) {
  // The state of a split parameter becomes its piece, once (later graphs find it so).
  NamedTensors state = optimizer.exchange_state({});
  for (const parallel::TensorParallelPiece& p : plan.pieces) {
    for (const std::string& kind : optimizer.state_kinds()) {
      for (auto& [key, t] : state) {
        if (key != p.name + "." + kind || t.shape() == p.piece->shape()) continue;
        t = parallel::take_piece(t, p.piece->shape(), o.rank, o.shards);
      }
    }
  }
  optimizer.exchange_state(std::move(state));
  std::vector<std::string> names;
  for (ir::Value* v : params) {
    std::string name = v->producer()->name();
    for (const parallel::TensorParallelPiece& p : plan.pieces)
      if (p.piece == v) name = p.name;
    names.push_back(name);
  }
  optimizer.apply(g, names, params, grads, in);
  std::vector<ir::Value*> updated;
  for (const parallel::TensorParallelPiece& p : plan.pieces) {
    ir::Node* u = nullptr;
    for (ir::Node* user : p.piece->users())
      if (user->def().update_role() && user->input(user->def().update_role()->param) == p.piece)
        u = user;
    MINIDL_CHECK(u != nullptr, "--tensor-parallel: the optimizer made no update of ",
                 p.piece->ref());
    updated.push_back(optim::updated_param(u));
  }
  parallel::gather_updated_pieces(g, plan, updated, o);
}

NamedTensors whole_state(const NamedTensors& own, Model& model, parallel::Communicator& shards) {
  const NamedTensors params = model.parameters();
  NamedTensors out;
  for (const auto& [key, t] : own) {
    const Tensor* param = find(params, key.substr(0, key.rfind('.')));
    MINIDL_CHECK(param != nullptr, "--tensor-parallel: optimizer state '", key,
                 "' of no parameter");
    if (param->shape() == t.shape()) {
      out.emplace_back(key, t);
    } else {
      out.emplace_back(key, parallel::gather_pieces(shards, t, param->shape()));
    }
  }
  return out;
}

void load_state_pieces(const NamedTensors& own, const NamedTensors& whole,
                       parallel::Communicator& shards) {
  for (const auto& [key, t] : own) {
    const Tensor* w = find(whole, key);
    MINIDL_CHECK(w != nullptr, "--tensor-parallel: no optimizer state '", key, "' to load");
    if (w->raw() == t.raw()) continue;
    Tensor(t).copy_from(w->shape() == t.shape()
                            ? *w
                            : parallel::take_piece(*w, t.shape(), shards.rank(), shards.size()));
  }
}

}  // namespace minidl::train
