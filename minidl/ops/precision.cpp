#include "minidl/ops/precision.hpp"

#include <fmt/format.h>

#include "minidl/ir/graph.hpp"
#include "minidl/ops/onednn/kernels.hpp"

namespace minidl::ops {

namespace {

/// The input channels a convolution's product sums over (its inner dimension is C*KH*KW), or -1
/// for any other op: the channel count of w [K,C,KH,KW], which every convolution pass has.
std::int64_t conv_input_channels(const ir::Node& n) {
  if (n.op() == "conv2d" || n.op() == "conv2d_bwd_data") return n.input(1)->shape()[1];
  if (n.op() == "conv2d_bwd_weights" || n.op() == "conv2d_bwd_weights_bias")
    return n.output(0)->shape()[1];
  return -1;
}

}  // namespace

std::string f32_reason(const ir::Node& n) {
  const std::int64_t c = conv_input_channels(n);
  if (c < 0 || c >= kBf16MinInputChannels) return "";
  return fmt::format("{} input channel{}, fewer than one bf16 block of {}", c, c == 1 ? "" : "s",
                     kBf16MinInputChannels);
}

bool MixedPrecision::run(ir::Graph& g) {
  if (precision_ == ir::Precision::F32) return false;
  bool changed = false;
  for (ir::Node* n : g.nodes()) {
    if (!ir::has_bf16_kernel(n->def()) || n->annotations().find("precision") != nullptr) continue;
    const std::string why = f32_reason(*n);
    ir::set_node_precision(*n, why.empty() ? precision_ : ir::Precision::F32, why);
    changed = true;
  }
  return changed;
}

std::string bf16_unavailable() {
#if MINIDL_WITH_ONEDNN
  return onednn::bf16_unavailable();
#else
  return "this build has no oneDNN (MINIDL_WITH_ONEDNN=OFF), whose kernels compute in bf16";
#endif
}

void check_precision(ir::Precision precision) {
  if (precision != ir::Precision::BF16) return;
  const std::string why = bf16_unavailable();
  MINIDL_CHECK(why.empty(), "precision bf16 ", why);
}

ir::Precision parse_precision(std::string_view name) {
  if (name == "f32") return ir::Precision::F32;
  if (name == "bf16") return ir::Precision::BF16;
  MINIDL_FAIL("unknown precision '", name, "' (expected f32 or bf16)");
}

}  // namespace minidl::ops
