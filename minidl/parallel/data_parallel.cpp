#include "minidl/parallel/data_parallel.hpp"

#include <algorithm>

#include "minidl/parallel/collectives.hpp"

namespace minidl::parallel {

bool DataParallel::run(ir::Graph& g) {
  // Match first, then rewrite.
  std::vector<std::pair<ir::Node*, int>> updates;
  for (ir::Node* n : g.nodes()) {
    const ir::AttrValue* phase = n->annotations().find("phase");
    if (!phase || std::get<std::string>(*phase) != "update") continue;
    const auto& names = n->def().input_names();
    auto it = std::find(names.begin(), names.end(), "grad");
    if (it != names.end()) updates.emplace_back(n, static_cast<int>(it - names.begin()));
  }
  for (auto [update, slot] : updates) {
    ir::Value* grad = update->input(slot);
    ir::Node* producer = grad->producer();
    ir::Value* reduced = allreduce(grad, share_, group_, producer->name() + ".allreduce");
    ir::Node* ar = reduced->producer();
    ar->annotations().set("phase", std::string("communication"));
    // Every reader of the gradient but the allreduce itself now reads the reduced value.
    g.replace_uses(grad, reduced, ar);
    // Start the reduction as soon as the gradient is final: right after its producer.
    const auto& order = g.nodes();
    auto pos = std::find(order.begin(), order.end(), producer);
    if (pos + 1 != order.end()) g.move_before(ar, *(pos + 1));
  }
  return !updates.empty();
}

}  // namespace minidl::parallel
