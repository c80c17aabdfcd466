// The IR: a Graph owns Nodes and Values. A Value is one output of one Node (SSA); a Node applies
// an op to input Values. Nodes are kept in a topological order (the order they were added in,
// which passes preserve), and that order is the execution order.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "minidl/core/tensor.hpp"
#include "minidl/ir/attrs.hpp"
#include "minidl/ir/op_def.hpp"

namespace minidl::ir {

class Value {
 public:
  int id() const { return id_; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Node* producer() const { return producer_; }
  int index() const { return index_; }  // which output of the producer
  Graph& graph() const { return *graph_; }
  const std::vector<Node*>& users() const { return users_; }
  /// "%17" or "%17:fc1.weight" for readable dumps.
  std::string ref() const;
  /// How the buffer holds the elements: "" for dense row-major (plain), a channel-blocked
  /// layout, "nChw16c" / "nChw8c" (the channels of a [N,C,H,W] value in blocks of 16 or 8, the
  /// innermost dimension; see channel_block), or "nhwc" (channels innermost, oneDNN's acdb: what
  /// its AMX bf16 convolutions run in). The shape stays the logical one. Set by
  /// ops::PropagateLayouts on values that only layout-aware kernels read and write; the runtime
  /// gives a node with such a value only kernels that can take it.
  const std::string& layout() const { return layout_; }
  /// Sets the layout; throws minidl::Error unless the value is a 4-D f32 or i32 value whose
  /// channels divide into whole blocks (no padding: the buffer keeps the plain size).
  void set_layout(std::string layout);
  /// The element type the buffer holds: dtype(), or BF16 for an f32 value that
  /// ops::PropagateLayouts keeps in bf16 between kernels that read and write bf16
  /// (KernelDef::bf16_values) under --precision bf16. The dtype stays the logical one (shape
  /// rules and the verifier see f32); the memory plan and the runtime's tensors use this one, and
  /// only kernels declaring bf16_values are given such a value.
  DType stored() const { return stored_; }
  /// Sets the stored type: dtype(), or BF16 for an f32 value; throws minidl::Error otherwise.
  void set_stored(DType t);

 private:
  friend class Graph;
  friend class Node;
  int id_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
  DType stored_ = DType::F32;
  std::string layout_;
  Node* producer_ = nullptr;
  int index_ = 0;
  Graph* graph_ = nullptr;
  std::vector<Node*> users_;
};

/// Which part of a training step a node belongs to: autograd marks the backward, optimizers their
/// updates, the parallel passes what they insert; printers, the preflight fingerprint and the
/// profile's categories read it. Sources print as such whatever their phase.
enum class Phase : std::uint8_t { Forward, Backward, Update, Communication };
std::string_view phase_name(Phase p);

/// What a graph input is for, where the step compiler or the loop must feed it by role rather
/// than by name: the key of every random mask (dropout), the learning rate and the optimizer's
/// step count of the schedule. Other nodes have no role.
enum class Role : std::uint8_t { None, RngKey, LearningRate, OptimizerStep };

/// The channel block of a layout: 1 for plain ("") and "nhwc", 16 for "nChw16c", 8 for
/// "nChw8c"; throws minidl::Error for any other name.
int channel_block(std::string_view layout);

class Node {
 public:
  const OpDef& def() const { return *def_; }
  const std::string& op() const { return def_->name(); }
  const std::string& name() const { return name_; }
  int id() const { return id_; }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(int i) const { return inputs_.at(i); }
  Value* output(int i = 0) const { return outputs_.at(i); }
  const Attrs& attrs() const { return attrs_; }
  /// Storage bound to a source node (parameter or state): the executable uses it directly.
  const Tensor& bound() const { return bound_; }
  /// Free-form annotations for passes (e.g. "stage", "shard", "backend").
  Attrs& annotations() { return annotations_; }
  const Attrs& annotations() const { return annotations_; }
  /// "relu 'fc1.act' (%17)", the prefix of every error about this node.
  std::string describe() const;

  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }
  /// The data-parallel thread replica the node computes (its thread in a parallel section of
  /// the runtime), or -1 for none. Set by the step compiler on a replica's inputs and by
  /// parallel::ThreadReplicas on everything that depends on exactly one replica.
  int replica() const { return replica_; }
  /// Sets the replica (-1: none); throws minidl::Error outside [-1, kMaxReplicas).
  void set_replica(int replica);
  static constexpr int kMaxReplicas = 1024;
  Role role() const { return role_; }
  void set_role(Role r) { role_ = r; }
  /// Takes other's annotations, phase and replica: a pass that replaces a node by a new one
  /// (fusion, a rebuilt sum) keeps what is known of the old.
  void take_marks(const Node& other);

  /// The kernel recorded for the node by ir::choose_kernels, if it holds for a graph compiled
  /// for `preferred`; else null. The graph drops a node's record when its inputs are replaced or
  /// the layout of one of its values changes, and a record made for another first backend (the
  /// node's "backend" annotation, else preferred) does not hold. Sources and aliases have none.
  const KernelChoice* kernel(Backend preferred) const;

 private:
  friend class Graph;
  friend class Value;
  friend void choose_kernels(Graph& g, Backend preferred);
  const OpDef* def_ = nullptr;
  std::string name_;
  int id_ = 0;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  Attrs attrs_;
  Attrs annotations_;
  Tensor bound_;
  Phase phase_ = Phase::Forward;
  int replica_ = -1;
  Role role_ = Role::None;
  std::optional<KernelChoice> kernel_;
};

/// Records on every node that runs a kernel the choice of ir::choose_kernel, unless the node
/// already has a record that holds for `preferred`. Layout propagation calls it and reads the
/// records, and the runtime then takes them instead of choosing again; a node changed since (see
/// Node::kernel) is chosen anew by the next call.
void choose_kernels(Graph& g, Backend preferred);
/// n's recorded kernel if it holds for `preferred`, else a choice made now (not recorded: the
/// graph is read-only here).
KernelChoice kernel_for(const Node& n, Backend preferred);

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Appends a node: checks attributes against the op's declaration (filling defaults), runs
  /// shape inference, and returns the node. Errors name the node, op and input shapes.
  Node* add_node(const OpDef& def, std::vector<Value*> inputs, Attrs attrs = {},
                 std::string name = {});
  /// Same, but binds storage (parameters, optimizer state) to a source node.
  Node* add_source(const OpDef& def, Attrs attrs, std::string name, Tensor bound);

  /// Nodes in execution order. Removed nodes are gone from this list.
  const std::vector<Node*>& nodes() const { return order_; }
  /// Finds a node by name, or null. Names are unique within a graph.
  Node* find(std::string_view name) const;
  /// The node with role r (at most one per role and graph), or null.
  Node* find(Role r) const;

  /// Values the caller reads after a run (loss, logits); dead-code elimination keeps them.
  void add_output(Value* v);
  const std::vector<Value*>& outputs() const { return outputs_; }

  /// Replaces every use of from by to (shapes and dtypes must match), except by node `except`
  /// (the node that computes `to` from `from`, when inserting a node after a value).
  void replace_uses(Value* from, Value* to, const Node* except = nullptr);
  /// Removes nodes whose outputs have no users; they must not be used.
  void remove(const std::vector<Node*>& nodes);
  /// Gives node the name of `old`, a node already removed: a pass that rebuilds a node in place
  /// of another keeps the name users and logs know it by (names stay unique: `old` is gone).
  void take_name(Node* node, const Node* old);
  /// Moves node to just before `before` in the order (scheduling passes).
  void move_before(Node* node, Node* before);
  /// Replaces the execution order by `order`, a permutation of nodes() (scheduling passes;
  /// the verifier checks after the pass that it is a valid one).
  void reorder(std::vector<Node*> order);

  /// Name scope for nodes added from now on: "fc1" makes "fc1.matmul".
  void push_scope(std::string scope);
  void pop_scope();
  std::string scoped(std::string_view name) const;

 private:
  Node* insert(const OpDef& def, std::vector<Value*> inputs, Attrs attrs, std::string name,
               Tensor bound);
  std::vector<std::unique_ptr<Node>> node_store_;
  std::vector<std::unique_ptr<Value>> value_store_;
  std::vector<Node*> order_;
  std::vector<Value*> outputs_;
  std::vector<std::string> scopes_;
  std::unordered_map<std::string, int> name_uses_;
  int next_id_ = 0;
};

/// RAII name scope: { NameScope s(g, "fc1"); ... }.
class NameScope {
 public:
  NameScope(Graph& g, std::string scope) : g_(g) { g_.push_scope(std::move(scope)); }
  ~NameScope() { g_.pop_scope(); }
  NameScope(const NameScope&) = delete;
  NameScope& operator=(const NameScope&) = delete;

 private:
  Graph& g_;
};

/// Gradient rules build backward nodes through this interface; autograd implements it on top of
/// the op table, so ops/ can state gradients without knowing autograd.
class GradCtx {
 public:
  virtual ~GradCtx() = default;
  virtual const Node& node() const = 0;
  Value* input(int i) const { return node().input(i); }
  /// The node's input count (optional trailing inputs may be absent).
  int num_inputs() const { return static_cast<int>(node().inputs().size()); }
  Value* output(int i) const { return node().output(i); }
  const Attrs& attrs() const { return node().attrs(); }
  /// Gradient of the loss w.r.t. output i, or null when output i does not reach the loss.
  virtual Value* out_grad(int i) const = 0;
  /// Whether input i needs a gradient (lies between a parameter and the loss).
  virtual bool needs_input_grad(int i) const = 0;
  virtual void set_input_grad(int i, Value* grad) = 0;
  /// Adds a backward node of op `def` and returns its output `output`. def is the op's object
  /// (op_relu_bwd, declared for ops/ in minidl/ops/op_table.hpp), not its name: a misspelt op
  /// fails to compile.
  virtual Value* op(const OpDef& def, std::vector<Value*> inputs, Attrs attrs = {},
                    int output = 0) = 0;
};

template <typename T>
T InferCtx::attr(std::string_view name) const {
  return node_.attrs().get<T>(name);
}

}  // namespace minidl::ir

/// Inside shape inference: fails with the node, op and input shapes when cond is false.
#define MINIDL_CHECK_NODE(ctx, cond, ...)                           \
  do {                                                              \
    if (!(cond)) (ctx).fail(::minidl::detail::concat(__VA_ARGS__)); \
  } while (0)
