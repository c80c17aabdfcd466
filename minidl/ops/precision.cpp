#include "minidl/ops/precision.hpp"

#include "minidl/ir/graph.hpp"
#include "minidl/ops/onednn/kernels.hpp"

namespace minidl::ops {

bool MixedPrecision::run(ir::Graph& g) {
  if (precision_ == ir::Precision::F32) return false;
  bool changed = false;
  for (ir::Node* n : g.nodes()) {
    if (!ir::has_bf16_kernel(n->def()) || n->annotations().find("precision") != nullptr) continue;
    n->annotations().set("precision", std::string(ir::precision_name(precision_)));
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
