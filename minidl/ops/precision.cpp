#include "minidl/ops/precision.hpp"

#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "minidl/core/log.hpp"
#include "minidl/ir/graph.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/native/peak.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/op_table.hpp"

namespace minidl::ops {

namespace {

// A convolution's passes: the forward, its data gradient, its weight gradient (with the bias's).
bool conv_pass(const ir::OpDef& d) {
  return &d == &op_conv2d || &d == &op_conv2d_bwd_data || &d == &op_conv2d_bwd_weights ||
         &d == &op_conv2d_bwd_weights_bias;
}

// The bf16 products: inputs 0 and 1 are the two factors their bf16 kernels round to bf16.
bool bf16_product(const ir::Node& n) {
  return ir::node_precision(n) == ir::Precision::BF16 &&
         (&n.def() == &op_matmul || conv_pass(n.def()));
}

// Whether a copy may stand in for factor v of product n. A matmul's factors are always plain.
// A convolution's are plain only when supplied from outside (a graph input, a parameter: bound
// plain); its activations take the layouts PropagateLayouts chooses later, which a copy would
// not follow.
bool shareable(const ir::Node& n, const ir::Value& v) {
  return &n.def() == &op_matmul || v.producer()->def().is_source();
}

// The input and output channels of a convolution pass (conv2d, its data or weight gradient).
std::pair<std::int64_t, std::int64_t> conv_channels(const ir::Node& n) {
  // The forward and the data gradient read w [K, C, KH, KW]; the weight gradients dy [N, K, ...]
  // and x [N, C, ...].
  if (&n.def() == &op_conv2d || &n.def() == &op_conv2d_bwd_data)
    return {n.input(1)->shape()[1], n.input(1)->shape()[0]};
  return {n.input(1)->shape()[1], n.input(0)->shape()[1]};
}

// Where oneDNN's bf16 convolutions run in a channel-blocked layout (nChw16c on CPUs with
// AVX512-BF16 and no AMX), a convolution with fewer input and fewer output channels than a block
// fills none on either side: its activations cannot take the bf16 layout (a region of one node,
// converting its input and output every step) and its bf16 product runs mostly on padding. The
// MNIST CNN's convolution (1 -> 8 channels) took 366-371 us per step for its weight and bias
// gradients in bf16 against 28-30 us for the native f32 kernel, and made the bf16 epoch 3.4x the
// f32 one. Such a convolution stays f32. (AMX's bf16 layout, nhwc, has no block.)
int bf16_block() { return ir::channel_block(bf16_layout()); }
bool bf16_pays(const ir::Node& n) {
  if (!conv_pass(n.def())) return true;
  const auto [c, k] = conv_channels(n);
  return c >= bf16_block() || k >= bf16_block();
}

}  // namespace

int share_bf16_factors(ir::Graph& g) {
  // The factors (inputs 0 and 1) of the bf16 products, each with its readers in graph order.
  // Readers in different thread replicas get a copy each (a replica's nodes read only their own
  // and shared values).
  using Key = std::pair<ir::Value*, int>;
  std::vector<Key> order;
  std::map<Key, std::vector<std::pair<ir::Node*, int>>> readers;
  for (ir::Node* n : g.nodes()) {
    if (!bf16_product(*n)) continue;
    for (int i = 0; i < 2; ++i) {
      ir::Value* v = n->input(i);
      if (v->dtype() != DType::F32 || v->stored() != DType::F32 ||
          &v->producer()->def() == &op_bf16_copy || !shareable(*n, *v))
        continue;
      auto& r = readers[Key{v, n->replica()}];
      if (r.empty()) order.emplace_back(v, n->replica());
      r.emplace_back(n, i);
    }
  }
  int copies = 0;
  // The inputs each reader takes from a copy; the readers are rebuilt below with them.
  std::vector<ir::Node*> rebuilt;
  std::unordered_map<ir::Node*, std::vector<std::pair<int, ir::Value*>>> replaced;
  for (const Key& key : order) {
    const auto& r = readers.at(key);
    if (r.size() < 2) continue;
    ir::Value* v = key.first;
    ir::Node* first = r.front().first;
    ir::Node* copy = g.add_node(op_bf16_copy, {v}, {}, v->producer()->name() + ".bf16");
    // The reader's phase, replica and placement annotations (a stage, a backend), not its
    // precision: the copy computes nothing.
    copy->set_phase(first->phase());
    copy->set_replica(first->replica());
    for (const auto& [name, value] : first->annotations().items())
      if (name != "precision") copy->annotations().set(name, value);
    g.move_before(copy, first);
    copy->output()->set_stored(DType::BF16);
    for (const auto& [user, i] : r) {
      auto& inputs = replaced[user];
      if (inputs.empty()) rebuilt.push_back(user);
      inputs.emplace_back(i, copy->output());
    }
    log_verbose("dispatch", "{}: one bf16 copy of {} for {} bf16 products", copy->describe(),
                v->ref(), r.size());
    ++copies;
  }
  // A reader becomes the same node on the copies (the graph replaces a value's uses only all at
  // once, and the value's other readers, an update among them, keep reading the f32 value).
  for (ir::Node* old : rebuilt) {
    std::vector<ir::Value*> inputs(old->inputs().begin(), old->inputs().end());
    for (const auto& [i, copy] : replaced.at(old)) inputs[static_cast<std::size_t>(i)] = copy;
    ir::Node* n = g.add_node(old->def(), std::move(inputs), old->attrs());
    n->take_marks(*old);
    g.move_before(n, old);
    for (std::size_t k = 0; k < old->outputs().size(); ++k)
      g.replace_uses(old->output(static_cast<int>(k)), n->output(static_cast<int>(k)));
    g.remove({old});
    g.take_name(n, old);
  }
  return copies;
}

bool MixedPrecision::run(ir::Graph& g) {
  if (precision_ == ir::Precision::F32) return false;
  bool changed = false;
  for (ir::Node* n : g.nodes()) {
    if (!ir::has_bf16_kernel(n->def()) || n->annotations().find("precision") != nullptr) continue;
    const bool pays = bf16_pays(*n);
    n->annotations().set("precision", std::string(pays ? ir::precision_name(precision_) : "f32"));
    if (!pays) {
      log_verbose("dispatch",
                  "{}: stays f32 (fewer than {} input and output channels, a block of {})",
                  n->describe(), bf16_block(), bf16_layout());
    }
    changed = true;
  }
  if (share_factors_ && share_bf16_factors(g) > 0) changed = true;
  return changed;
}

std::string bf16_unavailable() {
#if MINIDL_WITH_ONEDNN
  return onednn::bf16_unavailable();
#else
  return "this build has no oneDNN (MINIDL_WITH_ONEDNN=OFF), whose kernels compute in bf16";
#endif
}

std::string bf16_slower_than_f32(bool amx, double bf16_gflops, double f32_gflops) {
  if (amx || !(bf16_gflops < f32_gflops)) return {};
  return fmt::format(
      "oneDNN finds no AMX-BF16 here, and this CPU's AVX512-BF16 dot products reach {:.0f} "
      "GFLOP/s on a core against {:.0f} for its f32 FMAs ({:.2f}x): products and convolutions "
      "run slower in bf16 than in f32 here",
      bf16_gflops, f32_gflops, bf16_gflops / f32_gflops);
}

void check_precision(ir::Precision precision) {
  if (precision != ir::Precision::BF16) return;
  const std::string why = bf16_unavailable();
  MINIDL_CHECK(why.empty(), "precision bf16 ", why);
  static const std::string slower = [] {
#if MINIDL_WITH_ONEDNN
    if (onednn::bf16_on_amx()) return std::string();  // no need to measure: the tiles win
#endif
    return bf16_slower_than_f32(false, native::measure_peak(native::PeakLoop::Bf16Dot),
                                native::measure_peak(native::PeakLoop::F32Fma));
  }();
  if (!slower.empty()) {
    static std::once_flag warned;
    std::call_once(warned, [] { log_warn("precision bf16: {}", slower); });
  }
}

ir::Precision parse_precision(std::string_view name) {
  if (name == "f32") return ir::Precision::F32;
  if (name == "bf16") return ir::Precision::BF16;
  MINIDL_FAIL("unknown precision '", name, "' (expected f32 or bf16)");
}

}  // namespace minidl::ops
