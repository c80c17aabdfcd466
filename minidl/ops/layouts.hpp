// Layout propagation. oneDNN's convolutions and pooling run in channel-blocked layouts
// (nChw16c on AVX-512 machines); with plain NCHW tensors between ops, every such kernel reorders
// its activations in and out, each step. This pass gives a value oneDNN's blocked layout
// (Value::layout) when every kernel that writes or reads it can take it: a layout-aware kernel
// (oneDNN convolution and pooling, the native bias gradient), or an elementwise op all of whose
// values then share the layout (ReLU and its backward). So a run of such ops keeps the blocked
// layout, and the reorders happen only where it meets an op that wants plain tensors (the
// flatten before a linear layer, a graph output).
//
// Under --precision bf16 it first keeps in bf16 (ir::Value::stored) every 4-D activation that
// only kernels reading and writing bf16 values (KernelDef::bf16_values) produce and read, and
// that reaches a bf16 product (a node marked bf16 whose kernel computes in bf16) directly or
// through elementwise nodes: such values live in bf16_layout(), the layout the bf16 convolutions
// want, so a bf16 convolution, pooling or ReLU reads its predecessor's output as it is, and the
// conversions to and from f32 are left at the region's edges (the input image, the flatten,
// parameters and their gradients, which stay f32).
#pragma once

#include "minidl/ir/graph.hpp"
#include "minidl/ir/op_def.hpp"
#include "minidl/ir/pass.hpp"

namespace minidl::ops {

class PropagateLayouts final : public ir::Pass {
 public:
  /// preferred: the backend the graph will be compiled for (a node's "backend" annotation
  /// wins), so that the kernels it records are those the runtime takes. No layout changes
  /// unless oneDNN is built in and has a blocked convolution layout on this machine.
  explicit PropagateLayouts(ir::Backend preferred) : preferred_(preferred) {}
  std::string_view name() const override { return "propagate-layouts"; }
  /// It chooses and records every node's kernel (ir::choose_kernels), which the runtime then
  /// runs: after every pass that changes nodes' ops.
  std::vector<std::string> needs() const override {
    return {"bias-activation-fused", "updates-fused", "precision-assigned"};
  }
  std::vector<std::string> provides() const override { return {"layouts-assigned"}; }
  bool run(ir::Graph& g) override;

 private:
  ir::Backend preferred_;
};

/// The channel-blocked layout oneDNN's convolutions use on this machine ("nChw16c",
/// "nChw8c"), or "" without oneDNN or when it uses none.
const std::string& blocked_layout();
/// The layout oneDNN's bf16 convolutions use for bf16 activations on this machine ("nhwc" with
/// AMX, "nChw16c" with AVX512-BF16 alone), or "" without oneDNN or bf16 units.
const std::string& bf16_layout();
/// Whether v is a bf16 activation: stored as bf16 in a layout (the bf16 convolutions'). A plain
/// bf16 value is a factor's shared copy (share_bf16_factors), which constrains no layout.
bool bf16_activation(const ir::Value& v);

}  // namespace minidl::ops
