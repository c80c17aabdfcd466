// What every oneDNN kernel shares: the process-wide CPU engine and stream, memory descriptors of
// minidl shapes, and memory objects that wrap the runtime's buffers without copying. Only the
// files under ops/onednn/ include this header (it pulls in dnnl.hpp); op files include
// kernels.hpp.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::ops::onednn {

/// The CPU engine, created on first use (thread-safe) and kept for the process.
const dnnl::engine& engine();
/// The calling thread's in-order stream on engine(), created on its first use. On the CPU
/// runtime a primitive runs in the calling thread; one stream per thread lets thread replicas
/// run oneDNN kernels concurrently.
dnnl::stream& stream();

/// Dimensions of s; a scalar (rank 0) is one element, [1].
dnnl::memory::dims dims_of(const Shape& s);
/// Dense row-major descriptor of s (f32 unless told): [N,C] is ab, [N,C,H,W] is nchw (abcd).
dnnl::memory::desc plain_desc(const Shape& s,
                              dnnl::memory::data_type t = dnnl::memory::data_type::f32);
/// oneDNN's data type for a stored element type (f32, bf16, s32).
dnnl::memory::data_type data_type_of(DType t);
/// Descriptor of a value in its layout (ir::Value::layout) and stored type (ir::Value::stored):
/// plain_desc, a channel-blocked nChw16c / nChw8c one, or nhwc.
dnnl::memory::desc value_desc(const ir::Value* v);
/// Descriptor of s in the named layout ("" plain) holding elements of type `stored`.
dnnl::memory::desc layout_desc(const Shape& s, const std::string& layout,
                               DType stored = DType::F32);
/// Row-major f32 [rows, cols] descriptor over memory stored transposed ([cols, rows] row-major)
/// when transposed: the transpose is only a stride, nothing is copied.
dnnl::memory::desc matrix_desc(std::int64_t rows, std::int64_t cols, bool transposed);
/// All n elements as one dimension: elementwise primitives do not care about the shape.
dnnl::memory::desc flat_desc(std::int64_t n,
                             dnnl::memory::data_type t = dnnl::memory::data_type::f32);

/// Why a oneDNN kernel cannot take node n, or empty: every input and output must be f32 and
/// non-empty (oneDNN's zero-volume tensors are not worth a special case here).
std::string check_f32_nonempty(const ir::Node& n);

/// "oneDNN: could not create ... (unimplemented)", for errors and declined-kernel reasons.
std::string describe(const dnnl::error& e);

/// A kernel's supports check: `reason` holds what the caller's own checks found ("" when none
/// failed); then oneDNN must create the primitive descriptor make() builds. Sets why (when not
/// null) to the reason it cannot, "" when it can; returns whether it can.
template <typename Make>
bool supported(std::string reason, std::string* why, Make&& make) {
  if (reason.empty()) {
    try {
      (void)make();
    } catch (const dnnl::error& e) {
      reason = describe(e);
    }
  }
  if (why != nullptr) *why = reason;
  return reason.empty();
}
/// Throws minidl::Error naming node n and what failed.
[[noreturn]] void fail(const ir::Node& n, const dnnl::error& e);

/// A primitive's arguments bound to a node's tensors. The memory objects are created once, at
/// compile time, with no buffer of their own; each step bind() points them at the step's tensors.
/// A compiled executable passes the same buffers every step, so set_data_handle runs only on the
/// first step, but a changed pointer is noticed and rebound rather than assumed away.
class Args {
 public:
  enum class Side { In, Out };

  /// Argument `arg` (DNNL_ARG_SRC, ...) described by md, taken from the kernel's input or
  /// output `index`.
  void add(int arg, const dnnl::memory::desc& md, Side side, int index);
  /// Points every argument at this step's tensor.
  void bind(const ir::KernelArgs& k) {
    for (Slot& s : slots_) {
      const Tensor& t = s.side == Side::In ? k.in[s.index] : k.out[s.index];
      if (t.raw() != s.bound) rebind(s, t, k);
    }
  }
  const std::unordered_map<int, dnnl::memory>& map() const { return map_; }

 private:
  struct Slot {
    Side side;
    int index;
    dnnl::memory mem;  // a handle shared with the map's entry
    std::size_t bytes;
    const void* bound;
  };
  void rebind(Slot& s, const Tensor& t, const ir::KernelArgs& k);
  std::vector<Slot> slots_;
  std::unordered_map<int, dnnl::memory> map_;
};

/// The per-step kernel of primitive p: bind args, execute on stream() and wait, then run `then`
/// (work the primitive does not do, e.g. the loss next to a softmax) if given.
ir::Kernel primitive_kernel(dnnl::primitive p, Args args, ir::KernelFn then = nullptr);

/// A primitive run on a node's plain tensors in the layouts its primitive descriptor chose (the
/// descriptors were created with format `any`). An argument whose chosen layout is the plain one is
/// bound to the node's tensor directly; any other gets a buffer of its own and a reorder, both
/// created once, that run every step before (inputs) or after (outputs) the primitive.
class Staged {
 public:
  /// The primitive that runs node n (named in the log of the reorders, MINIDL_VERBOSE=reorders).
  Staged(dnnl::primitive p, const ir::Node& n) : p_(std::move(p)), node_(&n) {}

  /// Argument `arg` is the kernel's input or output `index`, stored as `plain`; the primitive
  /// wants it as `chosen`.
  void add(int arg, const dnnl::memory::desc& plain, const dnnl::memory::desc& chosen,
           Args::Side side, int index);
  /// An argument no tensor holds (a workspace): a buffer owned by the kernel, returned so that the
  /// kernel's own code can read or write it around run().
  dnnl::memory buffer(int arg, const dnnl::memory::desc& md);
  /// Binds this step's tensors, reorders the inputs in, executes, reorders the outputs out, waits.
  void run(const ir::KernelArgs& k);

 private:
  struct Step {
    dnnl::primitive p;
    std::unordered_map<int, dnnl::memory> args;
  };
  dnnl::primitive p_;
  const ir::Node* node_;
  Args user_;                                   // the node's tensors, plain
  std::unordered_map<int, dnnl::memory> args_;  // what p_ receives
  std::vector<Step> before_, after_;
};

/// The per-step kernel of a Staged primitive, then `then` if given.
ir::Kernel staged_kernel(Staged s, ir::KernelFn then = nullptr);

/// Runs make() (primitive creation at compile time), turning a dnnl::error into a minidl::Error
/// that names node n.
template <typename Make>
ir::Kernel create(const ir::Node& n, Make&& make) {
  try {
    return make();
  } catch (const dnnl::error& e) {
    fail(n, e);
  }
}

}  // namespace minidl::ops::onednn
