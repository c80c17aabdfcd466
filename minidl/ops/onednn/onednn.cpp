#include "minidl/ops/onednn/onednn.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <initializer_list>

#include "minidl/core/log.hpp"
#include "minidl/ops/onednn/kernels.hpp"

namespace minidl::ops::onednn {

using dnnl::memory;

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  // One stream per thread: thread replicas run oneDNN kernels from several threads at once, and a
  // stream must not be used concurrently.
  thread_local dnnl::stream s(engine());
  return s;
}

memory::dims dims_of(const Shape& s) {
  if (s.rank() == 0) return {1};
  return memory::dims(s.dims().begin(), s.dims().end());
}

memory::desc plain_desc(const Shape& s, memory::data_type t) {
  const memory::dims d = dims_of(s);
  memory::dims strides(d.size());
  memory::dim stride = 1;
  for (std::size_t i = d.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= d[i];
  }
  return memory::desc(d, t, strides);
}

memory::data_type data_type_of(DType t) {
  switch (t) {
    case DType::BF16:
      return memory::data_type::bf16;
    case DType::I32:
      return memory::data_type::s32;
    default:
      return memory::data_type::f32;
  }
}

memory::desc layout_desc(const Shape& s, const std::string& layout, DType stored) {
  const memory::data_type t = data_type_of(stored);
  if (layout == "nhwc") return memory::desc(dims_of(s), t, memory::format_tag::nhwc);
  switch (ir::channel_block(layout)) {
    case 16:
      return memory::desc(dims_of(s), t, memory::format_tag::nChw16c);
    case 8:
      return memory::desc(dims_of(s), t, memory::format_tag::nChw8c);
    default:
      return plain_desc(s, t);
  }
}

memory::desc value_desc(const ir::Value* v) {
  return layout_desc(v->shape(), v->layout(), v->stored());
}

namespace {
std::string isa_name(unsigned isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return fmt::format("0x{:x}", isa);
  }
}

// The layout oneDNN picks for the output of a convolution with enough channels for any block,
// its formats left to oneDNN, on factors of type t; empty when none of the candidates.
std::string picked_conv_layout(memory::data_type t, std::initializer_list<const char*> layouts) {
  const memory::dims x{1, 32, 8, 8}, w{32, 32, 3, 3};
  const memory::desc any_x(x, t, memory::format_tag::any);
  const memory::desc any_w(w, t, memory::format_tag::any);
  try {
    const dnnl::convolution_forward::primitive_desc pd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, any_x, any_w, any_x,
                                        {1, 1}, {1, 1}, {1, 1}),
        engine());
    const DType dtype = t == memory::data_type::bf16 ? DType::BF16 : DType::F32;
    for (const char* layout : layouts)
      if (pd.dst_desc() == layout_desc(Shape{1, 32, 8, 8}, layout, dtype)) return layout;
  } catch (const dnnl::error&) {
  }
  return {};
}

}  // namespace

std::string blocked_conv_layout() {
  return picked_conv_layout(memory::data_type::f32, {"nChw16c", "nChw8c"});
}

std::string bf16_conv_layout() {
  if (!bf16_unavailable().empty()) return {};
  // On bf16 factors with a bf16 result: AMX's convolutions pick nhwc, AVX512-BF16's a
  // channel-blocked layout.
  return picked_conv_layout(memory::data_type::bf16, {"nhwc", "nChw16c", "nChw8c"});
}

std::string bf16_unavailable() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  constexpr auto kBf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  if ((isa & kBf16) == kBf16) return {};
  const char* limit = std::getenv("DNNL_MAX_CPU_ISA");
  return fmt::format(
      "needs a CPU with AVX512-BF16 or AMX-BF16, and oneDNN finds neither here (its instruction "
      "set: {}{})",
      isa_name(isa),
      limit != nullptr ? fmt::format(", limited by DNNL_MAX_CPU_ISA={}", limit) : "");
}

bool bf16_on_amx() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  constexpr auto kAmx = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
  return (isa & kAmx) == kAmx;
}

memory::desc matrix_desc(std::int64_t rows, std::int64_t cols, bool transposed) {
  const memory::dims strides = transposed ? memory::dims{1, rows} : memory::dims{cols, 1};
  return memory::desc({rows, cols}, memory::data_type::f32, strides);
}

memory::desc flat_desc(std::int64_t n, memory::data_type t) {
  return memory::desc({n}, t, memory::format_tag::a);
}

std::string check_f32_nonempty(const ir::Node& n) {
  auto check = [](const ir::Value* v, const char* what, std::size_t i) -> std::string {
    if (v->dtype() != DType::F32) {
      return fmt::format("{} {} is {}, the oneDNN kernels take f32 only", what, i, v->dtype());
    }
    if (v->shape().numel() == 0) return fmt::format("{} {} is empty ({})", what, i, v->shape());
    return {};
  };
  for (std::size_t i = 0; i < n.inputs().size(); ++i) {
    if (std::string why = check(n.inputs()[i], "input", i); !why.empty()) return why;
  }
  for (std::size_t i = 0; i < n.outputs().size(); ++i) {
    if (std::string why = check(n.outputs()[i], "output", i); !why.empty()) return why;
  }
  return {};
}

std::string describe(const dnnl::error& e) {
  const char* status = "error";
  switch (e.status) {
    case dnnl_out_of_memory:
      status = "out of memory";
      break;
    case dnnl_invalid_arguments:
      status = "invalid arguments";
      break;
    case dnnl_unimplemented:
      status = "unimplemented";
      break;
    case dnnl_runtime_error:
      status = "runtime error";
      break;
    default:
      break;
  }
  return fmt::format("oneDNN: {} ({})", e.what(), status);
}

void fail(const ir::Node& n, const dnnl::error& e) { MINIDL_FAIL(n.describe(), ": ", describe(e)); }

void Args::add(int arg, const memory::desc& md, Side side, int index) {
  memory mem(md, engine(), DNNL_MEMORY_NONE);
  const bool inserted = map_.emplace(arg, mem).second;
  MINIDL_ASSERT(inserted, "oneDNN argument ", arg, " added twice");
  slots_.push_back({side, index, mem, md.get_size(), nullptr});
}

void Args::rebind(Slot& s, const Tensor& t, const ir::KernelArgs& k) {
  MINIDL_CHECK(t.nbytes() == s.bytes, k.node->describe(), ": oneDNN kernel compiled for ", s.bytes,
               " bytes at ", s.side == Side::In ? "input " : "output ", s.index, ", got ",
               t.shape(), " ", t.dtype());
  s.mem.set_data_handle(t.raw());
  s.bound = t.raw();
}

ir::Kernel primitive_kernel(dnnl::primitive p, Args args, ir::KernelFn then) {
  // Shared: std::function copies its target, and one primitive with its bound memory suffices.
  struct State {
    dnnl::primitive p;
    Args args;
  };
  auto st = std::make_shared<State>(State{std::move(p), std::move(args)});
  return [st, then](const ir::KernelArgs& k) {
    st->args.bind(k);
    try {
      st->p.execute(stream(), st->args.map());
      stream().wait();
    } catch (const dnnl::error& e) {
      fail(*k.node, e);
    }
    if (then != nullptr) then(k);
  };
}

namespace {
std::string arg_name(int arg) {
  switch (arg) {
    case DNNL_ARG_SRC:
      return "src";
    case DNNL_ARG_DST:
      return "dst";
    case DNNL_ARG_WEIGHTS:
      return "weights";
    case DNNL_ARG_BIAS:
      return "bias";
    case DNNL_ARG_DIFF_SRC:
      return "diff_src";
    case DNNL_ARG_DIFF_DST:
      return "diff_dst";
    case DNNL_ARG_DIFF_WEIGHTS:
      return "diff_weights";
    default:
      return fmt::format("argument {}", arg);
  }
}

/// "bf16 nhwc", "f32 plain", "f32 nChw16c", or "bf16 (oneDNN's own blocking)".
std::string desc_name(const memory::desc& d) {
  const char* type = d.data_type() == memory::data_type::bf16  ? "bf16"
                     : d.data_type() == memory::data_type::f32 ? "f32"
                                                               : "other";
  const DType t = d.data_type() == memory::data_type::bf16 ? DType::BF16 : DType::F32;
  const memory::dims dims = d.dims();
  const Shape s(std::vector<std::int64_t>(dims.begin(), dims.end()));
  if (d == plain_desc(s, d.data_type())) return fmt::format("{} plain", type);
  if (s.rank() == 4) {
    for (const char* layout : {"nChw16c", "nChw8c", "nhwc"}) {
      if ((layout == std::string("nhwc") || s[1] % ir::channel_block(layout) == 0) &&
          d == layout_desc(s, layout, t))
        return fmt::format("{} {}", type, layout);
    }
  }
  return fmt::format("{} (oneDNN's own blocking)", type);
}
}  // namespace

void Staged::add(int arg, const memory::desc& plain, const memory::desc& chosen, Args::Side side,
                 int index) {
  user_.add(arg, plain, side, index);
  const memory& tensor = user_.map().at(arg);
  if (chosen == plain) {
    args_.emplace(arg, tensor);
    return;
  }
  // Every step: where the tensors' layouts and types meet the primitive's (a conversion between
  // f32 and bf16 when the types differ).
  log_verbose("reorders", "{}: {} {} -> {}, every step", node_->describe(), arg_name(arg),
              desc_name(side == Args::Side::In ? plain : chosen),
              desc_name(side == Args::Side::In ? chosen : plain));
  memory own(chosen, engine());
  args_.emplace(arg, own);
  if (side == Args::Side::In) {
    const dnnl::reorder::primitive_desc pd(engine(), plain, engine(), chosen);
    before_.push_back({dnnl::reorder(pd), {{DNNL_ARG_FROM, tensor}, {DNNL_ARG_TO, own}}});
  } else {
    const dnnl::reorder::primitive_desc pd(engine(), chosen, engine(), plain);
    after_.push_back({dnnl::reorder(pd), {{DNNL_ARG_FROM, own}, {DNNL_ARG_TO, tensor}}});
  }
}

memory Staged::buffer(int arg, const memory::desc& md) {
  memory own(md, engine());
  const bool inserted = args_.emplace(arg, own).second;
  MINIDL_ASSERT(inserted, "oneDNN argument ", arg, " added twice");
  return own;
}

void Staged::run(const ir::KernelArgs& k) {
  user_.bind(k);
  try {
    for (Step& s : before_) s.p.execute(stream(), s.args);
    p_.execute(stream(), args_);
    for (Step& s : after_) s.p.execute(stream(), s.args);
    stream().wait();
  } catch (const dnnl::error& e) {
    fail(*k.node, e);
  }
}

ir::Kernel staged_kernel(Staged s, ir::KernelFn then) {
  auto st = std::make_shared<Staged>(std::move(s));
  return [st, then](const ir::KernelArgs& k) {
    st->run(k);
    if (then != nullptr) then(k);
  };
}

}  // namespace minidl::ops::onednn
