// Typed builders for the ops: each adds one node to its inputs' graph and returns its output.
// The op name, its file and its builder share one word (ops/activation/relu.cpp, ops::relu).
#pragma once

#include <limits>
#include <optional>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/registry.hpp"

namespace minidl::ops {

using ir::Value;

inline Value* matmul(Value* a, Value* b, bool trans_a = false, bool trans_b = false) {
  return apply("matmul", {a, b}, {{"trans_a", trans_a}, {"trans_b", trans_b}});
}
inline Value* bias_add(Value* x, Value* bias) { return apply("bias_add", {x, bias}); }
inline Value* relu(Value* x) { return apply("relu", {x}); }
inline Value* sigmoid(Value* x) { return apply("sigmoid", {x}); }
inline Value* tanh(Value* x) { return apply("tanh", {x}); }

/// Binary elementwise ops with NumPy broadcasting: shapes aligned on the right, a dimension of
/// size 1 stretches to the other's ([N,C] + [C], [N,C] * [N,1]). Gradients are summed back to
/// each input's shape. maximum and minimum give a tie's gradient to a.
inline Value* add(Value* a, Value* b) { return apply("add", {a, b}); }
inline Value* sub(Value* a, Value* b) { return apply("sub", {a, b}); }
inline Value* mul(Value* a, Value* b) { return apply("mul", {a, b}); }
inline Value* div(Value* a, Value* b) { return apply("div", {a, b}); }
inline Value* maximum(Value* a, Value* b) { return apply("maximum", {a, b}); }
inline Value* minimum(Value* a, Value* b) { return apply("minimum", {a, b}); }

/// Unary elementwise ops.
inline Value* scale(Value* x, double alpha) { return apply("scale", {x}, {{"alpha", alpha}}); }
inline Value* exp(Value* x) { return apply("exp", {x}); }
inline Value* log(Value* x) { return apply("log", {x}); }
inline Value* sqrt(Value* x) { return apply("sqrt", {x}); }
inline Value* neg(Value* x) { return apply("neg", {x}); }
/// x^exponent elementwise.
inline Value* pow(Value* x, double exponent) { return apply("pow", {x}, {{"exponent", exponent}}); }
/// min(max(x, lo), hi); an absent bound is no bound (gradient 1 inside [lo, hi], 0 outside).
inline Value* clamp(Value* x, std::optional<double> lo, std::optional<double> hi = std::nullopt) {
  ir::Attrs a;
  if (lo) a.set("min", *lo);
  if (hi) a.set("max", *hi);
  return apply("clamp", {x}, std::move(a));
}

/// Reductions over `axes` (negative counts from the end; empty: every axis, giving a scalar),
/// the reduced dimensions dropped or, with keepdim, kept as 1. Sums are in a fixed order, the
/// same bits for any thread count; max's gradient goes to the first maximal element.
inline Value* sum(Value* x, ir::Ints axes = {}, bool keepdim = false) {
  return apply("sum", {x}, {{"axes", std::move(axes)}, {"keepdim", keepdim}});
}
inline Value* mean(Value* x, ir::Ints axes = {}, bool keepdim = false) {
  return apply("mean", {x}, {{"axes", std::move(axes)}, {"keepdim", keepdim}});
}
inline Value* max(Value* x, ir::Ints axes = {}, bool keepdim = false) {
  return apply("max", {x}, {{"axes", std::move(axes)}, {"keepdim", keepdim}});
}
/// x broadcast to shape (NumPy rules), times alpha.
inline Value* expand(Value* x, ir::Ints shape, double alpha = 1.0) {
  return apply("expand", {x}, {{"shape", std::move(shape)}, {"alpha", alpha}});
}
/// The sum of x over every replica of the step (thread replicas and ranks), read by all; `key`
/// names it, the same in every replica (ops/reduce/cross_replica_sum.cpp).
inline Value* cross_replica_sum(Value* x, std::string key) {
  return apply("cross_replica_sum", {x}, {{"key", std::move(key)}});
}

/// BatchNorm's batch statistics (ops/nn/bn_stats.cpp): x [N,C] or [N,C,H,W] -> stats [3,C], the
/// count, sum and sum of squares of each channel.
inline Value* bn_stats(Value* x) { return apply("bn_stats", {x}); }
/// {mean, var} [C] of stats [3,C], the variance biased (ops/nn/bn_moments.cpp).
inline std::pair<Value*, Value*> bn_moments(Value* stats) {
  ir::Node* n = apply_node("bn_moments", {stats});
  return {n->output(0), n->output(1)};
}
/// y = (x - mean) / sqrt(var + eps) * weight + bias per channel (ops/nn/batch_norm.cpp); weight
/// and bias may be null (no affine transform), bias only with a weight.
inline Value* batch_norm(Value* x, Value* mean, Value* var, Value* weight = nullptr,
                         Value* bias = nullptr, double eps = 1e-5) {
  MINIDL_CHECK(weight != nullptr || bias == nullptr, "batch_norm: a bias needs a weight");
  std::vector<Value*> in{x, mean, var};
  if (weight != nullptr) in.push_back(weight);
  if (bias != nullptr) in.push_back(bias);
  return apply("batch_norm", std::move(in), {{"eps", eps}});
}
/// Updates BatchNorm's running statistics in place from stats [3,C] with PyTorch's formulas
/// (ops/nn/bn_update_running.cpp); returns the node, whose outputs are the updated buffers.
inline ir::Node* bn_update_running(Value* running_mean, Value* running_var,
                                   Value* num_batches_tracked, Value* stats,
                                   double momentum = 0.1) {
  return apply_node("bn_update_running", {running_mean, running_var, num_batches_tracked, stats},
                    {{"momentum", momentum}});
}
inline Value* reshape(Value* x, ir::Ints shape) {
  return apply("reshape", {x}, {{"shape", std::move(shape)}});
}
inline Value* flatten(Value* x, int start_dim = 1) {
  return apply("flatten", {x}, {{"start_dim", std::int64_t{start_dim}}});
}
/// The most inputs one concat node takes (the IR has no variable input count: concat declares
/// optional trailing inputs). ops::concat joins more by nesting nodes.
inline constexpr int kMaxConcatInputs = 16;
/// xs joined along axis (negative counts from the end); the other dimensions must agree.
Value* concat(const std::vector<Value*>& xs, int axis = 0);
/// x[start:end:step] along axis, Python's rules (negative indices count from the end, start and
/// end clamped); step >= 1 and the result must not be empty.
inline Value* slice(Value* x, int axis, std::int64_t start,
                    std::int64_t end = std::numeric_limits<std::int64_t>::max(),
                    std::int64_t step = 1) {
  return apply("slice", {x},
               {{"axis", std::int64_t{axis}}, {"start", start}, {"end", end}, {"step", step}});
}
/// y's dimension i is x's dimension perm[i].
inline Value* permute(Value* x, ir::Ints perm) {
  return apply("permute", {x}, {{"perm", std::move(perm)}});
}
/// x with dimensions d0 and d1 swapped (negative counts from the end), as a permute.
Value* transpose(Value* x, int d0, int d1);

/// Mean cross-entropy of softmax(logits) against integer labels; returns {loss, probs}.
inline std::pair<Value*, Value*> softmax_cross_entropy(Value* logits, Value* labels) {
  ir::Node* n = apply_node("softmax_cross_entropy", {logits, labels});
  return {n->output(0), n->output(1)};
}

/// Inverted dropout (ops/nn/dropout.cpp): key i64 [2] = (step, global index of x's first
/// sample) picks the mask, seed tells nodes apart; returns {y, mask}.
inline std::pair<Value*, Value*> dropout(Value* x, Value* key, double p, std::int64_t seed) {
  ir::Node* n = apply_node("dropout", {x, key}, {{"p", p}, {"seed", seed}});
  return {n->output(0), n->output(1)};
}

/// Graph inputs fed each step, and parameters/state bound to storage that outlives the graph.
Value* input(ir::Graph& g, const std::string& name, const Shape& shape, DType dtype = DType::F32);
Value* parameter(ir::Graph& g, const std::string& name, const Tensor& storage);
Value* state(ir::Graph& g, const std::string& name, const Tensor& storage);
Value* fill(ir::Graph& g, const Shape& shape, float value);
/// The graph's input with `role`, created (named name) on first use: one per role and graph.
Value* role_input(ir::Graph& g, ir::Role role, const std::string& name, const Shape& shape,
                  DType dtype);
/// The key of every random mask of the graph (ir::Role::RngKey): i64 [2] = (training step,
/// global index of this rank's first sample), written by the step before each run.
Value* rng_key(ir::Graph& g);

}  // namespace minidl::ops
