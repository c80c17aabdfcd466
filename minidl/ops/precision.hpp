// Mixed precision (--precision bf16). Every value of a graph stays f32 (parameters, gradients,
// activations, the loss); what changes is the arithmetic inside the kernels that have a bf16
// path (KernelDef::bf16: oneDNN's convolutions and products): they round their inputs to bf16,
// multiply on the CPU's bf16 units (AMX tiles or AVX512-BF16 dot products) and accumulate and
// store in f32. The pass below marks which nodes may do so; the kernels read the mark
// (ir::node_precision), and the dispatch log and the profile name the bf16 kernels
// ("onednn bf16") and say which marked nodes ran in f32.
#pragma once

#include <string>

#include "minidl/ir/op_def.hpp"
#include "minidl/ir/pass.hpp"

namespace minidl::ops {

/// precision BF16: every node whose op has a kernel with a bf16 path gets the annotation
/// precision=bf16 (a node that already carries one keeps it), but for a convolution whose input
/// and output channels both fill no block of the bf16 convolutions' layout (bf16_layout(): fewer
/// than 16 each in nChw16c), which gets precision=f32: its bf16 kernel converts its values and
/// runs mostly on padding, measured far slower than an f32 one. F32 changes nothing. Such a node
/// tries its bf16 kernels before those of the preferred backend (ir::kernel_order), so a graph
/// of native kernels runs its products in oneDNN's bf16 ones. Then, unless share_factors is
/// false, share_bf16_factors. It runs first in a pipeline: fused and replicated nodes take the
/// annotations of the nodes they replace.
class MixedPrecision final : public ir::Pass {
 public:
  explicit MixedPrecision(ir::Precision precision, bool share_factors = true)
      : precision_(precision), share_factors_(share_factors) {}
  std::string_view name() const override { return "mixed-precision"; }
  std::vector<std::string> provides() const override { return {"precision-assigned"}; }
  bool run(ir::Graph& g) override;

 private:
  ir::Precision precision_;
  bool share_factors_;
};

/// Every f32 value that two or more bf16 products read as a factor (a linear layer's weight, read
/// by its forward and its data gradient; its input, read by the forward and the weight gradient;
/// the output gradient, read by both gradients; a convolution's input image, read by its forward
/// and its weight gradient, and its weight, read by its forward and its data gradient) gets one
/// bf16_copy node, placed before its first reader, whose output is stored as bf16; the products
/// read that instead. The value is then rounded to bf16 once per step, and the products read it
/// as it is stored, instead of each converting it in a reorder of its own. A convolution's factor
/// is shared only when it comes from outside the graph (an input or a parameter, always plain):
/// its activations take the layouts chosen later. Returns how many copies it made.
int share_bf16_factors(ir::Graph& g);

/// Why kernels cannot compute in bf16 here, or "" when they can: oneDNN must be built in and the
/// CPU must have AVX512-BF16 or AMX-BF16 (as oneDNN sees it: DNNL_MAX_CPU_ISA may hide them).
std::string bf16_unavailable();
/// Why bf16 products are slower than f32 ones on this CPU, or "": without AMX (`amx` false: oneDNN
/// finds no AMX tiles), the bf16 kernels compute on AVX512-BF16 dot products, and where a core
/// runs those at fewer FLOP/s than its f32 FMAs (`bf16_gflops` < `f32_gflops`, both measured by
/// native::measure_peak), every product and convolution computes slower in bf16 than in f32. Its
/// text names both rates.
std::string bf16_slower_than_f32(bool amx, double bf16_gflops, double f32_gflops);
/// Throws minidl::Error saying why when precision is BF16 and bf16_unavailable() says so. Where
/// bf16 is available but bf16_slower_than_f32 for this CPU (the two rates measured once, about two
/// milliseconds, on the first call that asks for bf16 on a CPU without AMX), warns once.
void check_precision(ir::Precision precision);
/// "f32" or "bf16" as a Precision; throws minidl::Error naming the allowed values otherwise.
ir::Precision parse_precision(std::string_view name);

}  // namespace minidl::ops
