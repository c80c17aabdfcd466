#include "minidl/frontend/optim.hpp"

#include <algorithm>

#include "minidl/ops/ops.hpp"

namespace minidl::optim {

Sgd::Sgd(SgdOptions options) : options_(options) {
  MINIDL_CHECK(options.lr > 0.0, "learning rate must be positive, got ", options.lr);
  MINIDL_CHECK(options.momentum >= 0.0 && options.momentum < 1.0,
               "momentum must be in [0, 1), got ", options.momentum);
  MINIDL_CHECK(options.weight_decay >= 0.0, "weight decay must be >= 0, got ",
               options.weight_decay);
}

void Sgd::apply(ir::Graph& g, const std::vector<ir::Value*>& params,
                const std::vector<ir::Value*>& grads) {
  MINIDL_ASSERT(params.size() == grads.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    ir::Value* p = params[i];
    const std::string& name = p->producer()->name();
    ir::Node* update;
    if (options_.momentum == 0.0) {
      update =
          g.add_node(ops::op("sgd"), {p, grads[i]},
                     {{"lr", options_.lr}, {"weight_decay", options_.weight_decay}}, name + ".sgd");
    } else {
      const std::string key = name + ".momentum_buffer";
      auto it = std::find_if(velocity_.begin(), velocity_.end(),
                             [&](const auto& v) { return v.first == key; });
      if (it == velocity_.end()) {
        velocity_.emplace_back(key, Tensor::zeros(p->shape()));
        it = velocity_.end() - 1;
      }
      ir::Value* v = ops::state(g, key, it->second);
      update = g.add_node(ops::op("sgd_momentum"), {p, grads[i], v},
                          {{"lr", options_.lr},
                           {"momentum", options_.momentum},
                           {"weight_decay", options_.weight_decay}},
                          name + ".sgd");
    }
    update->annotations().set("phase", std::string("update"));
  }
}

void Sgd::init_state(const NamedTensors& params) {
  if (options_.momentum == 0.0) return;
  for (const auto& [name, t] : params) {
    const std::string key = name + ".momentum_buffer";
    auto it = std::find_if(velocity_.begin(), velocity_.end(),
                           [&](const auto& v) { return v.first == key; });
    if (it == velocity_.end()) velocity_.emplace_back(key, Tensor::zeros(t.shape(), t.dtype()));
  }
}

NamedTensors Sgd::state() const { return velocity_; }

}  // namespace minidl::optim
