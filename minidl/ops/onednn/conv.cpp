// oneDNN convolution for conv2d (its optional bias is the primitive's, its ReLU an eltwise
// post-op), conv2d_bwd_data and conv2d_bwd_weights, in f32 or, for a node whose precision is
// bf16, on bf16 factors with f32 results (the reorders below convert). Our tensors are plain NCHW /
// OIHW between ops; inside a kernel the primitive mostly runs in the layouts oneDNN picks for
// format `any` (its blocked nChw16c / OIhw16i16o direct convolution; see descs() for the
// exceptions), with the reorders around it created once at compile time (see Staged): the weights'
// every step, since SGD changes them, and the activations'. Arguments whose layout is the plain one
// are not reordered. f32 3x3 convolutions of stride 1 between at least 32 channels run oneDNN's
// Winograd F(4x4, 3x3) kernels where it has them (see with_algorithm()), the others its direct
// ones.
#include "minidl/core/log.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/onednn/kernels.hpp"
#include "minidl/ops/onednn/onednn.hpp"

namespace minidl::ops::onednn {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using dnnl::prop_kind;

/// One convolution in oneDNN's terms: x [N,C,H,W] (*) w [K,C,KH,KW] -> y [N,K,OH,OW].
struct Problem {
  Shape x, w, y;
  memory::dims strides, pad_l, pad_r;
  bool bias = false;
  bool relu = false;
  bool bf16 = false;  // mixed precision: bf16 activations and weights, f32 results
  // The result (y forward, dx backward) is a value stored as bf16 (ir::Value::stored): the
  // primitive writes bf16, so the next bf16 kernel reads it without a conversion.
  bool bf16_result = false;
  // Some value of the node is a bf16 activation (ops::bf16_activation: not a shared copy).
  bool bf16_values = false;
  algorithm alg = algorithm::convolution_direct;
};

enum class Pass { Forward, BwdData, BwdWeights };

/// Whether a pass of a convolution takes oneDNN's Winograd algorithm rather than its direct one.
/// Winograd's F(4x4, 3x3) computes a 4x4 output tile from a 6x6 input tile with 36 products per
/// channel pair instead of 144: fewer FLOPs, more transforms around them, and other float32
/// rounding (ResNet-20 trained for 15 epochs ends where PyTorch's direct convolutions do). oneDNN
/// 2.6 has it for f32 3x3 convolutions of stride 1 on AVX-512 CPUs. Measured there (minidl_bench's
/// onednn_direct and onednn_winograd rows, 2 threads, the CIFAR CNN's and ResNet-20's layers,
/// forward / data gradient / weight gradient): between 32 or 64 channels 1.23-2.15x the direct
/// kernels' rate, between 16 channels 0.65-0.77x, so it is taken from 32 channels on; but the
/// weight gradient only from 64 output channels: with 32 (ResNet-20's second stage, N128 C32
/// H16 K32) Winograd's ran at 0.84-0.87x the direct one's rate (2451-2608 against 2100-2186 us),
/// with 64 at 1.22-1.36x (32 -> 64 of the CIFAR CNN, 64 -> 64 of ResNet-20's third stage). Where
/// oneDNN has no such kernel (another CPU, another padding) the direct one runs.
bool winograd_pays(const Problem& p, const ir::Node& n, Pass pass) {
  constexpr std::int64_t kMinChannels = 32;
  constexpr std::int64_t kMinWeightGradientOutputs = 64;
  // MINIDL_WINOGRAD=off (read once) keeps every convolution direct, to compare the two on whole
  // models; "on" (or unset) lets this rule decide.
  static const bool enabled = env_switch("MINIDL_WINOGRAD");
  if (!enabled) return false;
  const auto& stride = n.attrs().get<ir::Ints>("stride");
  return !p.bf16 && p.w[2] == 3 && p.w[3] == 3 && stride[0] == 1 && stride[1] == 1 &&
         p.w[0] >= kMinChannels && p.w[1] >= kMinChannels &&
         (pass != Pass::BwdWeights || p.w[0] >= kMinWeightGradientOutputs);
}

Problem problem(const ir::Node& n, Shape x, Shape w, Shape y) {
  Problem p{std::move(x), std::move(w), std::move(y), {}, {}, {}};
  p.bf16 = ir::node_precision(n) == ir::Precision::BF16;
  p.bf16_result = n.output(0)->stored() == DType::BF16;
  for (const ir::Value* v : n.inputs()) p.bf16_values |= bf16_activation(*v);
  p.bf16_values |= p.bf16_result;
  const auto& stride = n.attrs().get<ir::Ints>("stride");
  const auto& pad = n.attrs().get<ir::Ints>("pad");
  for (int i = 0; i < 2; ++i) {
    p.strides.push_back(stride[i]);
    p.pad_l.push_back(pad[i]);
    // The right padding that ends the last window where ours ends (floor mode): less than the
    // left padding, or negative, when the last input rows are read by no window.
    p.pad_r.push_back((p.y[2 + i] - 1) * stride[i] + p.w[2 + i] - p.x[2 + i] - pad[i]);
  }
  return p;
}

/// Every convolution owns its scratch memory (a buffer of its kernel). oneDNN's default shares
/// one process-wide scratchpad that grows on demand, which primitives run at once by thread
/// replicas cannot share: the GEMM-based bf16 weight gradient crashed in a parallel section.
dnnl::primitive_attr own_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

struct Descs {
  memory::desc x, w, y;
};

/// The element types of x, w and y a pass's primitive works in: f32, or in mixed precision bf16
/// for the two factors of its product and f32 for what it computes (y forward, x's gradient,
/// w's gradient), which the kernel stores straight into our f32 tensors; bf16 for y or x's
/// gradient when that value is stored as bf16 (the weights' gradient stays f32).
struct Types {
  memory::data_type x, w, y;
};
Types types(const Problem& p, Pass pass) {
  using dt = memory::data_type;
  if (!p.bf16) return {dt::f32, dt::f32, dt::f32};
  const dt result = p.bf16_result ? dt::bf16 : dt::f32;
  switch (pass) {
    case Pass::Forward:
      return {dt::bf16, dt::bf16, result};
    case Pass::BwdData:
      return {result, dt::bf16, dt::bf16};
    case Pass::BwdWeights:
      return {dt::bf16, dt::f32, dt::bf16};
  }
  return {dt::f32, dt::f32, dt::f32};
}

memory::desc any_desc(const Shape& s, memory::data_type t) {
  return memory::desc(dims_of(s), t, memory::format_tag::any);
}
memory::desc plain_typed(const Shape& s, memory::data_type t) {
  return memory::desc(dims_of(s), t, memory::format_tag::abcd);
}
/// The descriptors a primitive is created with. Measured on the CIFAR and MNIST CNNs' layers:
/// oneDNN's blocked direct convolutions (format `any`, 16-channel blocks) beat its plain-layout
/// GEMM convolution by about 1.7x even with the reorders around them, except where the input has
/// fewer channels than a block (a first layer). There the forward and weight-gradient kernels
/// read our plain NCHW input directly (no reorder into a mostly padded block), and the data
/// gradient, whose blocked output would be mostly padding, runs in plain layouts. Not next to bf16
/// activations: the input is converted to bf16 anyway, and with a plain input oneDNN 2.6 has only
/// its reference convolution for their nhwc layout (with `any` it takes its AMX one, in nhwc). The
/// types are those of `t` (types(p, pass), or the forward's for a backward primitive's hint).
Descs descs(const Problem& p, Pass pass, Types t) {
  constexpr std::int64_t kBlock = 16;
  const bool few_channels = p.x[1] < kBlock && !p.bf16_values;
  if (pass == Pass::BwdData && few_channels) {
    return {plain_typed(p.x, t.x), plain_typed(p.w, t.w), plain_typed(p.y, t.y)};
  }
  return {few_channels ? plain_typed(p.x, t.x) : any_desc(p.x, t.x), any_desc(p.w, t.w),
          any_desc(p.y, t.y)};
}

/// The forward primitive, also the backward ones' hint. Always a training one: for inference this
/// oneDNN picks its NHWC brgconv, whose reorder of the output back to NCHW measured slower than
/// the convolution itself on the CIFAR CNN's first layer.
dnnl::convolution_forward::primitive_desc forward_pd(const Problem& p, Pass pass) {
  const prop_kind kind = prop_kind::forward_training;
  const Descs d = descs(p, pass, types(p, Pass::Forward));
  dnnl::primitive_attr attr = own_scratchpad();
  if (p.relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  if (p.bias) {
    const dnnl::convolution_forward::desc fd(kind, p.alg, d.x, d.w, plain_desc(Shape{p.w[0]}), d.y,
                                             p.strides, p.pad_l, p.pad_r);
    return {fd, attr, engine()};
  }
  const dnnl::convolution_forward::desc fd(kind, p.alg, d.x, d.w, d.y, p.strides, p.pad_l, p.pad_r);
  return {fd, attr, engine()};
}

/// The forward descriptor oneDNN 2.6 wants as a hint for a backward one: the same descriptors,
/// no bias or post-ops.
dnnl::convolution_forward::primitive_desc hint_pd(const Problem& p, Pass pass) {
  Problem plain = p;
  plain.bias = plain.relu = false;
  return forward_pd(plain, pass);
}

dnnl::convolution_backward_data::primitive_desc bwd_data_pd(const Problem& p) {
  const Descs d = descs(p, Pass::BwdData, types(p, Pass::BwdData));
  const dnnl::convolution_backward_data::desc bd(p.alg, d.x, d.w, d.y, p.strides, p.pad_l, p.pad_r);
  return {bd, own_scratchpad(), engine(), hint_pd(p, Pass::BwdData)};
}

/// With p.bias, the primitive also computes the bias gradient (diff_bias, f32 in bf16 too)
/// while it reads dy for the weights' (conv2d_bwd_weights_bias).
dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd(const Problem& p) {
  const Descs d = descs(p, Pass::BwdWeights, types(p, Pass::BwdWeights));
  if (p.bias) {
    const dnnl::convolution_backward_weights::desc bd(p.alg, d.x, d.w, plain_desc(Shape{p.w[0]}),
                                                      d.y, p.strides, p.pad_l, p.pad_r);
    return {bd, own_scratchpad(), engine(), hint_pd(p, Pass::BwdWeights)};
  }
  const dnnl::convolution_backward_weights::desc bd(p.alg, d.x, d.w, d.y, p.strides, p.pad_l,
                                                    p.pad_r);
  return {bd, own_scratchpad(), engine(), hint_pd(p, Pass::BwdWeights)};
}

/// p, or p with the Winograd algorithm where it pays for the pass and oneDNN creates the pass's
/// primitive with it (make(p) throws otherwise). Each pass decides alone (ResNet-20's second
/// stage computes its weight gradients directly, its other passes with Winograd). A node's
/// "algorithm" annotation, "direct" or "winograd", overrides whether it pays (the benchmarks run
/// both); oneDNN must still have the kernel.
template <typename Make>
Problem with_algorithm(Problem p, const ir::Node& n, Pass pass, Make&& make) {
  bool wanted = winograd_pays(p, n, pass);
  if (const ir::AttrValue* a = n.annotations().find("algorithm")) {
    const auto* name = std::get_if<std::string>(a);
    MINIDL_CHECK(name != nullptr && (*name == "direct" || *name == "winograd"), n.describe(),
                 ": annotation 'algorithm' must be direct or winograd, got ",
                 ir::attr_to_string(*a));
    wanted = *name == "winograd" && !p.bf16;
  }
  if (!wanted) return p;
  Problem w = p;
  w.alg = algorithm::convolution_winograd;
  try {
    (void)make(w);
  } catch (const dnnl::error&) {
    return p;
  }
  return w;
}

// conv2d: x, w[, bias] -> y
Problem forward_problem(const ir::Node& n) {
  Problem p = problem(n, n.input(0)->shape(), n.input(1)->shape(), n.output(0)->shape());
  p.bias = n.inputs().size() > 2;
  p.relu = activation_of(n.attrs()) == Activation::Relu;
  return with_algorithm(p, n, Pass::Forward,
                        [](const Problem& q) { return forward_pd(q, Pass::Forward); });
}
// conv2d_bwd_data: dy, w -> dx
Problem bwd_data_problem(const ir::Node& n) {
  const Problem p = problem(n, n.output(0)->shape(), n.input(1)->shape(), n.input(0)->shape());
  return with_algorithm(p, n, Pass::BwdData, [](const Problem& q) { return bwd_data_pd(q); });
}
// conv2d_bwd_weights: dy, x -> dw; conv2d_bwd_weights_bias: dy, x -> dw, dbias
Problem bwd_weights_problem(const ir::Node& n) {
  Problem p = problem(n, n.input(1)->shape(), n.output(0)->shape(), n.input(0)->shape());
  p.bias = n.outputs().size() > 1;
  return with_algorithm(p, n, Pass::BwdWeights, [](const Problem& q) { return bwd_weights_pd(q); });
}

/// A supports function: f32 and non-empty, and oneDNN creates the primitive.
template <typename Make>
bool supports(const ir::Node& n, std::string* why, Make&& make) {
  return supported(check_f32_nonempty(n), why, std::forward<Make>(make));
}

/// MINIDL_VERBOSE=dispatch names the algorithm and oneDNN's implementation of each pass.
template <typename PrimitiveDesc>
void log_dispatch(const ir::Node& n, const Problem& p, const PrimitiveDesc& pd) {
  log_verbose("dispatch", "{}: oneDNN {} convolution, {}", n.describe(),
              p.alg == algorithm::convolution_winograd ? "Winograd" : "direct", pd.impl_info_str());
}

}  // namespace

bool conv2d_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, [&] { return forward_pd(forward_problem(n), Pass::Forward); });
}

bool conv2d_bwd_data_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, [&] { return bwd_data_pd(bwd_data_problem(n)); });
}

bool conv2d_bwd_weights_supports(const ir::Node& n, std::string* why) {
  return supports(n, why, [&] { return bwd_weights_pd(bwd_weights_problem(n)); });
}

bool conv2d_winograd(const ir::Node& n) {
  const std::string& op = n.def().name();
  const Problem p = op == "conv2d"            ? forward_problem(n)
                    : op == "conv2d_bwd_data" ? bwd_data_problem(n)
                                              : bwd_weights_problem(n);
  return p.alg == algorithm::convolution_winograd;
}

ir::Kernel conv2d_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Problem p = forward_problem(n);
    const auto pd = forward_pd(p, Pass::Forward);
    log_dispatch(n, p, pd);
    Staged s{dnnl::convolution_forward(pd), n};
    s.add(DNNL_ARG_SRC, value_desc(n.input(0)), pd.src_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_WEIGHTS, value_desc(n.input(1)), pd.weights_desc(), Args::Side::In, 1);
    if (p.bias) s.add(DNNL_ARG_BIAS, plain_desc(Shape{p.w[0]}), pd.bias_desc(), Args::Side::In, 2);
    s.add(DNNL_ARG_DST, value_desc(n.output(0)), pd.dst_desc(), Args::Side::Out, 0);
    s.buffer(DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc());
    return staged_kernel(std::move(s));
  });
}

ir::Kernel conv2d_bwd_data_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Problem p = bwd_data_problem(n);
    const auto pd = bwd_data_pd(p);
    log_dispatch(n, p, pd);
    Staged s{dnnl::convolution_backward_data(pd), n};
    s.add(DNNL_ARG_DIFF_DST, value_desc(n.input(0)), pd.diff_dst_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_WEIGHTS, value_desc(n.input(1)), pd.weights_desc(), Args::Side::In, 1);
    s.add(DNNL_ARG_DIFF_SRC, value_desc(n.output(0)), pd.diff_src_desc(), Args::Side::Out, 0);
    s.buffer(DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc());
    return staged_kernel(std::move(s));
  });
}

ir::Kernel conv2d_bwd_weights_kernel(const ir::Node& n) {
  return create(n, [&] {
    const Problem p = bwd_weights_problem(n);
    const auto pd = bwd_weights_pd(p);
    log_dispatch(n, p, pd);
    Staged s{dnnl::convolution_backward_weights(pd), n};
    s.add(DNNL_ARG_DIFF_DST, value_desc(n.input(0)), pd.diff_dst_desc(), Args::Side::In, 0);
    s.add(DNNL_ARG_SRC, value_desc(n.input(1)), pd.src_desc(), Args::Side::In, 1);
    s.add(DNNL_ARG_DIFF_WEIGHTS, value_desc(n.output(0)), pd.diff_weights_desc(), Args::Side::Out,
          0);
    if (p.bias) {
      s.add(DNNL_ARG_DIFF_BIAS, plain_desc(Shape{p.w[0]}), pd.diff_bias_desc(), Args::Side::Out, 1);
    }
    s.buffer(DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc());
    return staged_kernel(std::move(s));
  });
}

}  // namespace minidl::ops::onednn
