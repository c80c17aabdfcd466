#include "minidl/ir/graph.hpp"

#include <algorithm>
#include <unordered_set>

namespace minidl::ir {

std::string Value::ref() const { return fmt::format("%{}", id_); }

int channel_block(std::string_view layout) {
  if (layout.empty()) return 1;
  if (layout == "nChw16c") return 16;
  if (layout == "nChw8c") return 8;
  if (layout == "nhwc") return 1;
  MINIDL_FAIL("unknown layout '", layout, "' (expected plain, nChw16c, nChw8c or nhwc)");
}

void Value::set_layout(std::string layout) {
  const int block = channel_block(layout);
  MINIDL_CHECK(
      layout.empty() || (shape_.rank() == 4 && dtype_size(dtype_) == 4 && shape_[1] % block == 0),
      "value ", ref(), " of ", producer_->describe(), " cannot take layout ", layout,
      ": it needs a 4-D f32 or i32 value whose channels are a multiple of ", block, ", got ",
      shape_, " ", dtype_);
  if (layout == layout_) return;
  layout_ = std::move(layout);
  // Whether a kernel takes a value depends on its layout: the choices around it no longer hold.
  producer_->kernel_.reset();
  for (Node* u : users_) u->kernel_.reset();
}

void Value::set_stored(DType t) {
  MINIDL_CHECK(t == dtype_ || (dtype_ == DType::F32 && t == DType::BF16), "value ", ref(), " of ",
               producer_->describe(), " is ", dtype_, " and cannot be stored as ", t);
  if (t == stored_) return;
  stored_ = t;
  producer_->kernel_.reset();
  for (Node* u : users_) u->kernel_.reset();
}

std::string Node::describe() const {
  return fmt::format("{} '{}' (%{})", op(), name_, outputs_.empty() ? id_ : outputs_[0]->id());
}

std::string_view phase_name(Phase p) {
  switch (p) {
    case Phase::Forward:
      return "forward";
    case Phase::Backward:
      return "backward";
    case Phase::Update:
      return "update";
    case Phase::Communication:
      return "communication";
  }
  return "?";
}

void Node::set_replica(int replica) {
  MINIDL_CHECK(replica >= -1 && replica < kMaxReplicas, describe(), ": replica ", replica,
               " is outside [0, ", kMaxReplicas, ")");
  replica_ = replica;
}

const KernelChoice* Node::kernel(Backend preferred) const {
  if (!kernel_ || kernel_->backend != node_backend(*this, preferred)) return nullptr;
  return &*kernel_;
}

void choose_kernels(Graph& g, Backend preferred) {
  for (Node* n : g.nodes()) {
    if (n->def().is_source() || n->def().is_alias() || n->kernel(preferred) != nullptr) continue;
    n->kernel_ = choose_kernel(*n, preferred);
  }
}

KernelChoice kernel_for(const Node& n, Backend preferred) {
  if (const KernelChoice* c = n.kernel(preferred)) return *c;
  return choose_kernel(n, preferred);
}

void Node::take_marks(const Node& other) {
  for (const auto& [k, v] : other.annotations_.items()) annotations_.set(k, v);
  phase_ = other.phase_;
  replica_ = other.replica_;
}

Node* Graph::add_node(const OpDef& def, std::vector<Value*> inputs, Attrs attrs, std::string name) {
  return insert(def, std::move(inputs), std::move(attrs), std::move(name), Tensor());
}

Node* Graph::add_source(const OpDef& def, Attrs attrs, std::string name, Tensor bound) {
  return insert(def, {}, std::move(attrs), std::move(name), std::move(bound));
}

Node* Graph::insert(const OpDef& def, std::vector<Value*> inputs, Attrs attrs, std::string name,
                    Tensor bound) {
  auto node = std::make_unique<Node>();
  Node* n = node.get();
  n->def_ = &def;
  n->id_ = next_id_++;
  n->name_ = name.empty() ? scoped(def.name()) : std::move(name);
  // Unique names: the second "fc1.relu" becomes "fc1.relu.1".
  if (int uses = name_uses_[n->name_]++; uses > 0) {
    n->name_ += fmt::format(".{}", uses);
    ++name_uses_[n->name_];
  }
  n->bound_ = std::move(bound);

  const std::string where = fmt::format("{} '{}'", def.name(), n->name_);
  const std::size_t most = def.input_names().size();
  const auto least = static_cast<std::size_t>(def.min_inputs());
  MINIDL_CHECK(inputs.size() >= least && inputs.size() <= most, where, ": expected ",
               least == most ? fmt::format("{}", most) : fmt::format("{} to {}", least, most),
               " inputs (", fmt::format("{}", fmt::join(def.input_names(), ", ")), "), got ",
               inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    MINIDL_CHECK(inputs[i] != nullptr, where, ": input ", i, " (", def.input_names()[i],
                 ") is null");
    MINIDL_CHECK(&inputs[i]->graph() == this, where, ": input ", i, " (", def.input_names()[i],
                 ") belongs to another graph");
  }
  // Attributes: known names, right kinds, defaults filled in.
  for (const auto& [key, value] : attrs.items()) {
    auto decl = std::find_if(def.attr_decls().begin(), def.attr_decls().end(),
                             [&](const AttrDecl& d) { return d.name == key; });
    MINIDL_CHECK(decl != def.attr_decls().end(), where, ": unknown attribute '", key, "'");
    if (decl->kind != value.index()) {
      // Ints given for a float attribute are fine; anything else is a mistake.
      const bool int_as_float =
          decl->kind == AttrValue(0.0).index() && value.index() == AttrValue(0L).index();
      MINIDL_CHECK(int_as_float, where, ": attribute '", key, "' must be ",
                   attr_kind_name(decl->kind), ", got ", attr_kind_name(value.index()));
      attrs.set(key, static_cast<double>(std::get<std::int64_t>(value)));
    }
  }
  for (const auto& decl : def.attr_decls()) {
    if (attrs.has(decl.name)) continue;
    MINIDL_CHECK(decl.default_.has_value(), where, ": missing required attribute '", decl.name,
                 "'");
    attrs.set(decl.name, *decl.default_);
  }
  n->attrs_ = std::move(attrs);
  n->inputs_ = std::move(inputs);

  const std::size_t n_out = def.output_names().size();
  std::vector<Shape> shapes(n_out);
  std::vector<DType> dtypes(n_out, DType::F32);
  MINIDL_ASSERT(def.infer_fn() != nullptr, "op ", def.name(), " has no shape rule");
  // Outputs get ids before inference so that error messages can name the node by its output.
  for (std::size_t i = 0; i < n_out; ++i) {
    auto v = std::make_unique<Value>();
    v->id_ = next_id_++;
    v->producer_ = n;
    v->index_ = static_cast<int>(i);
    v->graph_ = this;
    n->outputs_.push_back(v.get());
    value_store_.push_back(std::move(v));
  }
  InferCtx ctx(*n, shapes, dtypes);
  def.infer_fn()(ctx);
  for (std::size_t i = 0; i < n_out; ++i) {
    n->outputs_[i]->shape_ = std::move(shapes[i]);
    n->outputs_[i]->dtype_ = n->outputs_[i]->stored_ = dtypes[i];
  }
  for (Value* in : n->inputs_) in->users_.push_back(n);
  order_.push_back(n);
  node_store_.push_back(std::move(node));
  return n;
}

Node* Graph::find(std::string_view name) const {
  for (Node* n : order_)
    if (n->name() == name) return n;
  return nullptr;
}

Node* Graph::find(Role r) const {
  for (Node* n : order_)
    if (n->role() == r) return n;
  return nullptr;
}

void Graph::add_output(Value* v) {
  MINIDL_CHECK(&v->graph() == this, "graph output ", v->ref(), " belongs to another graph");
  if (std::find(outputs_.begin(), outputs_.end(), v) == outputs_.end()) outputs_.push_back(v);
}

void Graph::replace_uses(Value* from, Value* to, const Node* except) {
  MINIDL_CHECK(from->shape() == to->shape() && from->dtype() == to->dtype(), "cannot replace ",
               from->ref(), " ", from->shape(), " by ", to->ref(), " ", to->shape());
  std::vector<Node*> kept;
  for (Node* user : from->users_) {
    if (user == except) {
      kept.push_back(user);
      continue;
    }
    for (Value*& in : user->inputs_)
      if (in == from) in = to;
    to->users_.push_back(user);
    user->kernel_.reset();  // chosen for the old input's layout
  }
  from->users_ = std::move(kept);
  std::replace(outputs_.begin(), outputs_.end(), from, to);
}

void Graph::remove(const std::vector<Node*>& nodes) {
  std::unordered_set<Node*> dead(nodes.begin(), nodes.end());
  for (Node* n : nodes) {
    for (Value* out : n->outputs_) {
      for (Node* u : out->users_)
        MINIDL_ASSERT(dead.count(u), "removing ", n->describe(), " still used by ", u->describe());
    }
    for (Value* in : n->inputs_) std::erase(in->users_, n);
  }
  std::erase_if(order_, [&](Node* n) { return dead.count(n) > 0; });
}

void Graph::take_name(Node* node, const Node* old) {
  MINIDL_ASSERT(std::find(order_.begin(), order_.end(), old) == order_.end(),
                "take_name: ", old->describe(), " is still in the graph");
  node->name_ = old->name_;
}

void Graph::move_before(Node* node, Node* before) {
  auto it = std::find(order_.begin(), order_.end(), node);
  MINIDL_ASSERT(it != order_.end());
  order_.erase(it);
  order_.insert(std::find(order_.begin(), order_.end(), before), node);
}

void Graph::reorder(std::vector<Node*> order) {
  MINIDL_ASSERT(order.size() == order_.size(), "reorder: ", order.size(), " nodes for ",
                order_.size());
  std::unordered_set<const Node*> seen(order.begin(), order.end());
  MINIDL_ASSERT(seen.size() == order.size(), "reorder: a node appears twice");
  for (const Node* n : order_) MINIDL_ASSERT(seen.count(n) == 1, "reorder: a node is missing");
  order_ = std::move(order);
}

void Graph::push_scope(std::string scope) { scopes_.push_back(std::move(scope)); }
void Graph::pop_scope() { scopes_.pop_back(); }

std::string Graph::scoped(std::string_view name) const {
  std::string s;
  for (const auto& sc : scopes_) {
    if (sc.empty()) continue;
    s += sc;
    s += '.';
  }
  s += name;
  return s;
}

}  // namespace minidl::ir
