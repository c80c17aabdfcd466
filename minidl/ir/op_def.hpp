// OpDef: everything minidl knows about one op, declared in one place (one file under ops/):
// its inputs and outputs, attributes, shape and dtype inference, kernels per backend, and its
// gradient rule. ir only defines the types; ops/ fills them and holds the table.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "minidl/core/tensor.hpp"
#include "minidl/ir/attrs.hpp"

namespace minidl::ir {

class Node;
class Value;
class Graph;
class GradCtx;

enum class Backend { Native, OneDnn };
std::string_view backend_name(Backend b);

/// The arithmetic a node asks its kernel for: f32, or mixed bf16 (products of bf16-rounded
/// inputs accumulated and stored in f32; every value of the graph stays f32). Set by the
/// node's "precision" annotation (f32|bf16, see ops::MixedPrecision); a kernel without a bf16
/// path (KernelDef::bf16) computes in f32 whatever the node asks.
enum class Precision { F32, BF16 };
std::string_view precision_name(Precision p);

/// Shape and dtype inference for one node: reads input shapes and attributes, sets outputs.
class InferCtx {
 public:
  InferCtx(const Node& node, std::vector<Shape>& out_shapes, std::vector<DType>& out_dtypes)
      : node_(node), out_shapes_(out_shapes), out_dtypes_(out_dtypes) {}

  const Node& node() const { return node_; }
  int num_inputs() const;
  const Shape& input(int i) const;
  DType dtype(int i) const;
  template <typename T>
  T attr(std::string_view name) const;
  void set_output(int i, Shape shape, DType dtype = DType::F32);

  /// Throws minidl::Error: "<op> '<name>' (%id): <msg>; x=[..] w=[..]".
  [[noreturn]] void fail(const std::string& msg) const;

 private:
  const Node& node_;
  std::vector<Shape>& out_shapes_;
  std::vector<DType>& out_dtypes_;
};

/// What a kernel sees each step: tensor views of the node's inputs and outputs, and the node.
struct KernelArgs {
  const Node* node = nullptr;
  std::span<const Tensor> in;
  std::span<const Tensor> out;
  const Attrs& attrs() const;
};

/// A kernel ready to run one node; created once at compile time by a KernelDef's factory,
/// which may capture whatever it precomputes (blocking, primitives).
using Kernel = std::function<void(const KernelArgs&)>;
using KernelFn = void (*)(const KernelArgs&);
using SupportsFn = bool (*)(const Node&, std::string* why);
using KernelFactory = std::function<Kernel(const Node&)>;

struct KernelDef {
  Backend backend = Backend::Native;
  std::string name;
  SupportsFn supports = nullptr;  // null: accepts every node
  KernelFactory make;
  /// The kernel reads and writes its node's values in whatever layout each carries
  /// (Value::layout); other kernels take plain values only (or, for an elementwise op, values
  /// that all share one layout).
  bool layouts = false;
  /// The kernel computes in bf16 when its node's precision is BF16 (node_precision).
  bool bf16 = false;
  /// The kernel reads and writes f32 values stored as bf16 (Value::stored), each in the layout it
  /// carries; other kernels are given only values stored as their dtype.
  bool bf16_values = false;
  /// The kernel is tried before the preferred backend's kernels (OpDef::preferred): measured
  /// faster than the other backends' on every layout and type it takes.
  bool preferred = false;
};

/// An optimizer update's inputs: which is the parameter it writes in place and which the
/// gradient it reads. The parallel passes reduce that gradient and, for the root strategy,
/// broadcast that parameter; an op that writes a parameter in place without this role is refused
/// by them rather than skipped.
struct UpdateRole {
  int param = 0;
  int grad = 1;
  /// The optional input that scales the gradient (global-norm clipping's factor), or -1.
  int grad_scale = -1;
};

/// What a collective op does to time: it moves data between ranks (Collective), or it waits for
/// a non-blocking one started earlier (Wait). The profile splits communication from waiting by
/// it.
enum class CommRole : std::uint8_t { None, Collective, Wait };

using InferFn = void (*)(InferCtx&);
using GradFn = void (*)(GradCtx&);
/// Floating-point operations one run of the node performs (profiler figures).
using FlopsFn = std::int64_t (*)(const Node&);

struct AttrDecl {
  std::string name;
  std::size_t kind = 0;               // index into AttrValue
  std::optional<AttrValue> default_;  // empty: required
};

class OpDef {
 public:
  explicit OpDef(std::string name) : name_(std::move(name)) {}

  /// Input names in order. Trailing names ending in '?' are optional ({"x", "w", "bias?"}): a
  /// node may leave out any suffix of them. input_names() holds the names without the '?'.
  OpDef& inputs(std::vector<std::string> names);
  OpDef& outputs(std::vector<std::string> names);
  /// Required attribute of type T (int, float, bool, std::string, Ints).
  template <typename T>
  OpDef& attr(std::string name) {
    attrs_.push_back({std::move(name), AttrValue(typename AttrStorage<T>::type{}).index(), {}});
    return *this;
  }
  /// Optional attribute with a default.
  template <typename T>
  OpDef& attr(std::string name, T value) {
    AttrValue v(static_cast<typename AttrStorage<T>::type>(value));
    attrs_.push_back({std::move(name), v.index(), v});
    return *this;
  }
  OpDef& infer(InferFn fn);
  OpDef& kernel(Backend backend, KernelFn fn, SupportsFn supports = nullptr);
  OpDef& kernel_factory(Backend backend, std::string name, KernelFactory make,
                        SupportsFn supports = nullptr);
  OpDef& grad(GradFn fn);
  /// How many floating-point operations a node of this op performs (the profiler's GFLOP/s);
  /// ops without a count are reported by time only.
  OpDef& flops(FlopsFn fn);
  /// The op has no gradient; why says so in errors and in the op-table test.
  OpDef& no_grad(std::string why);
  /// Output out is written into input in's buffer (optimizer updates).
  OpDef& inplace(int out, int in);
  /// Output out is input in's data under another shape (reshape): no kernel runs.
  OpDef& alias(int out, int in);
  /// The node changes state outside its outputs; dead-code elimination keeps it.
  OpDef& side_effect();
  /// The value is supplied from outside (inputs, parameters): no kernel.
  OpDef& source();
  /// Every output element is a function of the inputs' elements at the same position: any
  /// kernel then works on any layout, provided all of the node's values share it (a node whose
  /// values differ in shape, a broadcasting add, never shares a blocked layout: it stays plain).
  OpDef& elementwise();
  /// The kernel declared last takes values in any layout (KernelDef::layouts).
  OpDef& layout_aware();
  /// The kernel declared last computes in bf16 when its node asks (KernelDef::bf16).
  OpDef& mixed_precision();
  /// The kernel declared last takes f32 values stored as bf16 (KernelDef::bf16_values).
  OpDef& bf16_values();
  /// The kernel declared last is tried first whatever backend the graph prefers (a node's
  /// "backend" annotation still wins): for a kernel measured faster than the other backends' in
  /// every case it accepts (native max pooling). Declined nodes fall through to the usual order.
  OpDef& preferred();
  /// The op is an optimizer update of input `param` (in place) by gradient input `grad`;
  /// grad_scale, when the op has one, is the optional input that multiplies the gradient.
  OpDef& update(int param, int grad, int grad_scale = -1);
  /// The op communicates between ranks (see CommRole).
  OpDef& communication(CommRole role);

  const std::string& name() const { return name_; }
  const std::vector<std::string>& input_names() const { return inputs_; }
  /// How many inputs every node of this op has: those before the first optional one.
  int min_inputs() const { return min_inputs_; }
  const std::vector<std::string>& output_names() const { return outputs_; }
  const std::vector<AttrDecl>& attr_decls() const { return attrs_; }
  InferFn infer_fn() const { return infer_; }
  const std::vector<KernelDef>& kernels() const { return kernels_; }
  GradFn grad_fn() const { return grad_; }
  FlopsFn flops_fn() const { return flops_; }
  const std::string& no_grad_reason() const { return no_grad_; }
  bool has_grad_rule() const { return grad_ != nullptr || !no_grad_.empty(); }
  /// Input index whose buffer output out shares (in place or alias), or -1.
  int shares_input(int out) const;
  bool is_alias() const { return alias_; }
  bool has_side_effect() const { return side_effect_; }
  bool is_source() const { return source_; }
  bool is_elementwise() const { return elementwise_; }
  const std::optional<UpdateRole>& update_role() const { return update_; }
  CommRole comm_role() const { return comm_; }

 private:
  std::string name_;
  std::vector<std::string> inputs_;
  int min_inputs_ = 0;
  std::vector<std::string> outputs_{"y"};
  std::vector<AttrDecl> attrs_;
  InferFn infer_ = nullptr;
  std::vector<KernelDef> kernels_;
  GradFn grad_ = nullptr;
  FlopsFn flops_ = nullptr;
  std::string no_grad_;
  std::vector<std::pair<int, int>> shares_;
  bool alias_ = false;
  bool side_effect_ = false;
  bool source_ = false;
  bool elementwise_ = false;
  std::optional<UpdateRole> update_;
  CommRole comm_ = CommRole::None;
};

/// The backend whose kernels n tries first: its "backend" annotation (native|onednn), else
/// `preferred`.
Backend node_backend(const Node& n, Backend preferred);
/// The precision n asks for: its "precision" annotation (f32|bf16), else F32.
Precision node_precision(const Node& n);
/// Kernel k's name as the dispatch log and the profile show it: with " bf16" when k computes n
/// in bf16 or reads or writes a value of n stored as bf16.
std::string kernel_label(const Node& n, const KernelDef& k);
/// Whether op `def` has a kernel that computes in bf16 (KernelDef::bf16).
bool has_bf16_kernel(const OpDef& def);
/// The kernels of n's op in the order the runtime tries them: those of node_backend(n,
/// preferred) first, then the others, each in declaration order; except that a node that names
/// no backend tries the kernels declared OpDef::preferred() before those, and, when its
/// precision is BF16, the kernels with a bf16 path before everything.
std::vector<const KernelDef*> kernel_order(const Node& n, Backend preferred);
/// Why kernel k cannot take the layouts (and stored types, Value::stored) of n's values, or ""
/// when it can.
std::string layout_refusal(const Node& n, const KernelDef& k);

/// The kernel that runs a node: the first of kernel_order(n, preferred) that takes the layouts of
/// n's values and whose supports accepts n.
struct KernelChoice {
  const KernelDef* kernel = nullptr;  // null: no kernel accepts the node
  /// "; <kernel> declined: <why>" for each kernel tried before it (or all, when none accepts).
  std::string declined;
  /// node_backend(n, preferred) when it was made: the choice holds while that is unchanged.
  Backend backend = Backend::Native;
};
/// Makes the choice for n now (asking each kernel's supports, which may create a library
/// primitive). The one place kernels are chosen; ir::choose_kernels records the result on the
/// nodes, where layout propagation and the runtime read it.
KernelChoice choose_kernel(const Node& n, Backend preferred);

}  // namespace minidl::ir
