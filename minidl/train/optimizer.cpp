#include "minidl/train/optimizer.hpp"

#include <algorithm>

#include "minidl/ops/ops.hpp"

namespace minidl::optim {

ir::Value* updated_param(ir::Node* u) {
  const int slot = u->def().update_role()->param;
  for (std::size_t o = 0; o < u->outputs().size(); ++o)
    if (u->def().shares_input(static_cast<int>(o)) == slot) return u->output(static_cast<int>(o));
  MINIDL_FAIL(u->describe(), ": no output writes the parameter");
}

const Tensor& Optimizer::state_for(const std::string& param, const std::string& kind,
                                   const Shape& like) {
  const std::string key = param + "." + kind;
  auto it =
      std::find_if(state_.begin(), state_.end(), [&](const auto& s) { return s.first == key; });
  if (it == state_.end()) {
    state_.emplace_back(key, Tensor::zeros(like));
    it = state_.end() - 1;
  }
  return it->second;
}

void Optimizer::apply(ir::Graph& g, const std::vector<ir::Value*>& params,
                      const std::vector<ir::Value*>& grads, const StepInputs& in) {
  std::vector<std::string> names;
  for (ir::Value* p : params) names.push_back(p->producer()->name());
  apply(g, names, params, grads, in);
}

void Optimizer::init_state(const NamedTensors& params) {
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const auto& [name, t] : params) shapes.emplace_back(name, t.shape());
  init_state(shapes);
}

namespace {
ir::Node* mark_update(ir::Node* n) {
  n->set_phase(ir::Phase::Update);
  return n;
}
}  // namespace

Sgd::Sgd(SgdOptions options) : options_(options) {
  MINIDL_CHECK(options.lr > 0.0, "learning rate must be positive, got ", options.lr);
  MINIDL_CHECK(options.momentum >= 0.0 && options.momentum < 1.0,
               "momentum must be in [0, 1), got ", options.momentum);
  MINIDL_CHECK(!options.nesterov || options.momentum > 0.0,
               "Nesterov momentum needs a momentum above 0 (--momentum)");
  MINIDL_CHECK(options.weight_decay >= 0.0, "weight decay must be >= 0, got ",
               options.weight_decay);
}

std::string Sgd::describe() const {
  std::string s = "SGD(";
  if (options_.momentum > 0.0)
    s += fmt::format("{}momentum {}", options_.nesterov ? "Nesterov " : "", options_.momentum);
  if (options_.weight_decay > 0.0)
    s += fmt::format("{}weight decay {}", options_.momentum > 0.0 ? ", " : "",
                     options_.weight_decay);
  return s + ")";
}

void Sgd::apply(ir::Graph& g, const std::vector<std::string>& names,
                const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
                const StepInputs& in) {
  MINIDL_ASSERT(params.size() == grads.size() && names.size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    ir::Value* p = params[i];
    const std::string& name = names[i];
    if (options_.momentum == 0.0) {
      mark_update(g.add_node(ops::op("sgd"), {p, grads[i], in.lr},
                             {{"weight_decay", options_.weight_decay}}, name + ".sgd"));
      continue;
    }
    ir::Value* v =
        ops::state(g, name + ".momentum_buffer", state_for(name, "momentum_buffer", p->shape()));
    mark_update(g.add_node(ops::op("sgd_momentum"), {p, grads[i], v, in.lr},
                           {{"momentum", options_.momentum},
                            {"weight_decay", options_.weight_decay},
                            {"nesterov", options_.nesterov}},
                           name + ".sgd"));
  }
}

void Sgd::init_state(const std::vector<std::pair<std::string, Shape>>& params) {
  for (const auto& [name, shape] : params)
    for (const std::string& kind : state_kinds()) state_for(name, kind, shape);
}

std::vector<std::string> Sgd::state_kinds() const {
  if (options_.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

AdamW::AdamW(AdamWOptions options) : options_(options) {
  MINIDL_CHECK(options.lr > 0.0, "learning rate must be positive, got ", options.lr);
  MINIDL_CHECK(options.beta1 >= 0.0 && options.beta1 < 1.0, "beta1 must be in [0, 1), got ",
               options.beta1);
  MINIDL_CHECK(options.beta2 >= 0.0 && options.beta2 < 1.0, "beta2 must be in [0, 1), got ",
               options.beta2);
  MINIDL_CHECK(options.eps > 0.0, "eps must be positive, got ", options.eps);
  MINIDL_CHECK(options.weight_decay >= 0.0, "weight decay must be >= 0, got ",
               options.weight_decay);
}

std::string AdamW::describe() const {
  return fmt::format("AdamW(betas {}/{}, eps {}, weight decay {})", options_.beta1, options_.beta2,
                     options_.eps, options_.weight_decay);
}

void AdamW::apply(ir::Graph& g, const std::vector<std::string>& names,
                  const std::vector<ir::Value*>& params, const std::vector<ir::Value*>& grads,
                  const StepInputs& in) {
  MINIDL_ASSERT(params.size() == grads.size() && names.size() == params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    ir::Value* p = params[i];
    const std::string& name = names[i];
    ir::Value* m = ops::state(g, name + ".exp_avg", state_for(name, "exp_avg", p->shape()));
    ir::Value* v = ops::state(g, name + ".exp_avg_sq", state_for(name, "exp_avg_sq", p->shape()));
    mark_update(g.add_node(ops::op("adamw"), {p, grads[i], m, v, in.lr, in.step},
                           {{"beta1", options_.beta1},
                            {"beta2", options_.beta2},
                            {"eps", options_.eps},
                            {"weight_decay", options_.weight_decay}},
                           name + ".adamw"));
  }
}

void AdamW::init_state(const std::vector<std::pair<std::string, Shape>>& params) {
  for (const auto& [name, shape] : params)
    for (const std::string& kind : state_kinds()) state_for(name, kind, shape);
}

std::vector<std::string> AdamW::state_kinds() const { return {"exp_avg", "exp_avg_sq"}; }

}  // namespace minidl::optim
