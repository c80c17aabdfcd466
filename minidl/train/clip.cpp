#include "minidl/train/clip.hpp"

#include <algorithm>
#include <unordered_set>

#include "minidl/ops/ops.hpp"

namespace minidl::train {

bool ClipGradNorm::run(ir::Graph& g) {
  norm_ = nullptr;
  if (max_norm_ <= 0.0) return false;
  std::vector<ir::Node*> updates;
  for (ir::Node* n : g.nodes())
    if (n->def().update_role()) updates.push_back(n);
  if (updates.empty()) return false;
  for (ir::Node* u : updates) {
    const ir::UpdateRole& role = *u->def().update_role();
    MINIDL_CHECK(role.grad_scale >= 0, "clip-grad-norm: ", u->describe(),
                 ": its op has no grad_scale input, so its gradient cannot be clipped");
    MINIDL_CHECK(static_cast<int>(u->inputs().size()) <= role.grad_scale,
                 "clip-grad-norm: ", u->describe(), " is scaled already");
  }
  // The total: one sum_squares per distinct gradient, added in update order.
  std::vector<ir::Value*> seen;
  std::unordered_set<ir::Node*> clipping;  // the nodes made here, up to the factor
  ir::Value* total = given_total_;
  for (ir::Node* u : updates) {
    if (given_total_ != nullptr) break;
    ir::Value* grad = u->input(u->def().update_role()->grad);
    if (std::find(seen.begin(), seen.end(), grad) != seen.end()) continue;
    seen.push_back(grad);
    ir::Node* sq = g.add_node(
        ops::op("sum_squares"), {grad}, {},
        u->input(u->def().update_role()->param)->producer()->name() + ".grad_sum_squares");
    clipping.insert(sq);
    ir::Value* s = sq->output();
    if (total != nullptr) {
      ir::Node* add = g.add_node(ops::op("add"), {total, s}, {}, "clip.total");
      clipping.insert(add);
      s = add->output();
    }
    total = s;
  }
  ir::Node* coef = g.add_node(ops::op("clip_coef"), {total}, {{"max_norm", max_norm_}}, "clip");
  clipping.insert(coef);
  for (ir::Node* n : clipping) n->set_phase(ir::Phase::Update);
  norm_ = coef->output(1);
  g.add_output(norm_);

  // Every update, rebuilt with the factor, and whatever reads what they write (the root
  // strategy's broadcasts) move after the clipping nodes; the rest keeps its order.
  std::unordered_set<const ir::Node*> after;
  for (ir::Node* u : updates) {
    const ir::UpdateRole& role = *u->def().update_role();
    std::vector<ir::Value*> inputs = u->inputs();
    while (static_cast<int>(inputs.size()) < role.grad_scale) inputs.push_back(nullptr);
    MINIDL_CHECK(std::find(inputs.begin(), inputs.end(), nullptr) == inputs.end(),
                 "clip-grad-norm: ", u->describe(),
                 " leaves out optional inputs before grad_scale");
    inputs.push_back(coef->output(0));
    ir::Node* scaled = g.add_node(u->def(), inputs, u->attrs(), u->name() + "+clip");
    scaled->take_marks(*u);
    g.move_before(scaled, u);  // in u's place: what reads u's outputs may follow it already
    for (std::size_t o = 0; o < u->outputs().size(); ++o)
      g.replace_uses(u->output(static_cast<int>(o)), scaled->output(static_cast<int>(o)));
    g.remove({u});
    after.insert(scaled);
  }
  std::vector<ir::Node*> first, clip, last;
  for (ir::Node* n : g.nodes()) {
    bool late = after.count(n) > 0;
    for (const ir::Value* in : n->inputs()) late |= after.count(in->producer()) > 0;
    if (late) after.insert(n);
    (late ? last : clipping.count(n) ? clip : first).push_back(n);
  }
  std::vector<ir::Node*> order = first;
  order.insert(order.end(), clip.begin(), clip.end());
  order.insert(order.end(), last.begin(), last.end());
  for (std::size_t i = order.size() - 1; i-- > 0;) g.move_before(order[i], order[i + 1]);
  return true;
}

}  // namespace minidl::train
