// Typed builders for the ops: each adds one node to its inputs' graph and returns its output.
// The op name, its file and its builder share one word (ops/activation/relu.cpp, ops::relu).
#pragma once

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
inline Value* add(Value* a, Value* b) { return apply("add", {a, b}); }
inline Value* mul(Value* a, Value* b) { return apply("mul", {a, b}); }
inline Value* scale(Value* x, double alpha) { return apply("scale", {x}, {{"alpha", alpha}}); }
inline Value* sum(Value* x) { return apply("sum", {x}); }
inline Value* mean(Value* x) { return apply("mean", {x}); }
/// The sum of x over every replica of the step (thread replicas and ranks), read by all; `key`
/// names it, the same in every replica (ops/reduce/cross_replica_sum.cpp).
inline Value* cross_replica_sum(Value* x, std::string key) {
  return apply("cross_replica_sum", {x}, {{"key", std::move(key)}});
}
inline Value* reshape(Value* x, ir::Ints shape) {
  return apply("reshape", {x}, {{"shape", std::move(shape)}});
}
inline Value* flatten(Value* x, int start_dim = 1) {
  return apply("flatten", {x}, {{"start_dim", std::int64_t{start_dim}}});
}

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
