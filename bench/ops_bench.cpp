// The models' ops on each backend. Every benchmark is one row of a table of cases (op, attributes,
// input shapes, cost formula) run by one generic routine: build a one-node graph through the op
// registry with the inputs as graph inputs, compile it with the requested backend, check in the
// executable's kernel table which kernel the node got, fill the inputs with seeded random data and
// time Executable::run(). A node that the requested backend declines is skipped with the reason,
// so a native run is never reported under the oneDNN name.
//
// Products and convolutions also run in mixed precision: "<backend>_bf16" marks the node bf16
// (f32 tensors, bf16 factors, as --precision bf16 runs a product whose neighbours are f32), and
// for convolutions "<backend>_bf16act" also stores its activations (not the weights or their
// gradient) as bf16 in the bf16 convolutions' layout, as --precision bf16 keeps them between bf16
// kernels. A variant whose kernel would not compute in bf16 is skipped with the reason.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "bench.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ops/layouts.hpp"
#if MINIDL_WITH_ONEDNN
#include "minidl/ops/onednn/kernels.hpp"
#endif
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl::bench {
namespace {

using ir::Ints;
using std::int64_t;

constexpr std::uint64_t kSeed = 2024;

/// How an input is filled: N(0,1) floats, every element `value` (an optimizer's step count, a
/// second moment that must not be negative), i32 labels in [0, classes), or output `output` of op
/// `from` run once on the native backend over N(0,1) inputs of shapes `from_shapes` (an argmax
/// must point inside its window, so it is made by the forward op, not drawn).
struct Input {
  Shape shape;
  DType dtype = DType::F32;
  int64_t classes = 0;
  std::optional<double> value;
  std::string from;
  ir::Attrs from_attrs;
  std::vector<Shape> from_shapes;
  int output = 0;
};

Input f32(Shape s) { return {.shape = std::move(s)}; }
Input labels(int64_t n, int64_t classes) {
  return {.shape = Shape{n}, .dtype = DType::I32, .classes = classes};
}
/// The argmax of an r x r max pooling (stride r) over N(0,1) values of shape x, made by
/// max_pool2d (output 1).
Input pool_argmax(const Shape& x, int64_t r) {
  return {.shape = Shape{x[0], x[1], x[2] / r, x[3] / r},
          .dtype = DType::I32,
          .from = "max_pool2d",
          .from_attrs = {{"kernel", Ints{r, r}}},
          .from_shapes = {x},
          .output = 1};
}

/// The cost of one run of a node: FLOPs (compute-bound ops), or null for memory-bound ops, whose
/// cost is the bytes of every input read once and every output written once.
using FlopFn = std::function<double(const ir::Node&)>;

/// How a case's 4-D values are stored: plain f32, in oneDNN's blocked f32 layout (as
/// propagate-layouts lays out f32 activations between convolutions), or as bf16 in the bf16
/// convolutions' layout (as --precision bf16 keeps them); i32 values (argmax) take the layout only.
/// BlockedToPlain: the input side (x, or dx of a backward) blocked and the rest plain, as pool2
/// before the flatten leaves them.
enum class Storage { Plain, Blocked, Bf16, BlockedToPlain };

struct Case {
  std::string bench;  // "conv2d_fwd"
  std::string op;     // "conv2d"
  std::string shape;  // "N32_C3_H32_W32_K32_R3"
  ir::Attrs attrs;
  std::vector<Input> inputs;
  FlopFn flops;
  Storage storage = Storage::Plain;
};

double numel(const ir::Value* v) { return static_cast<double>(v->shape().numel()); }

// The op's own FLOP count (ir::OpDef::flops): the profiler reports the same figure.
double op_flops(const ir::Node& n) { return static_cast<double>(n.def().flops_fn()(n)); }

double bytes_moved(const ir::Node& n) {
  double b = 0.0;
  for (const ir::Value* v : n.inputs())
    b += numel(v) * static_cast<double>(dtype_size(v->stored()));
  for (const ir::Value* v : n.outputs())
    b += numel(v) * static_cast<double>(dtype_size(v->stored()));
  return b;
}

std::string nchw_label(const Shape& s) {
  if (s.rank() == 4) return fmt::format("N{}_C{}_H{}_W{}", s[0], s[1], s[2], s[3]);
  return fmt::format("N{}_C{}", s[0], s[1]);
}

// ---- the table --------------------------------------------------------------------------------

class Table {
 public:
  /// The cases, each benchmark name once (layers of different models may share a shape).
  std::vector<Case> cases;

  void add(Case c) {
    if (names_.insert(c.bench + "/" + c.shape).second) cases.push_back(std::move(c));
  }

  // A linear layer's product y[m,n] = x[m,k] w[n,k]^T (weights [out, in], as nn::Linear and
  // PyTorch store them) and its two backward products, all labelled with the forward shape:
  // dX = dY W, dW = dY^T X.
  void matmul(int64_t m, int64_t k, int64_t n) {
    const std::string s = fmt::format("M{}_K{}_N{}", m, k, n);
    add({"matmul_fwd", "matmul", s, {{"trans_b", true}}, {f32({m, k}), f32({n, k})}, op_flops});
    add({"matmul_bwd_data", "matmul", s, {}, {f32({m, n}), f32({n, k})}, op_flops});
    add({"matmul_bwd_weights",
         "matmul",
         s,
         {{"trans_a", true}},
         {f32({m, n}), f32({m, k})},
         op_flops});
    // The weight gradient fused with its SGD-momentum update, as fuse-update-into-product leaves
    // it on one replica (param and velocity [n,k], then the learning rate), and the update alone.
    // Both cost the product's FLOPs or the bytes of every tensor read and written once.
    add({"matmul_bwd_weights_sgd_momentum",
         "matmul_sgd_momentum",
         s,
         {{"trans_a", true}, {"momentum", 0.9f}},
         {f32({m, n}), f32({m, k}), f32({n, k}), f32({n, k}), f32(Shape{})},
         op_flops});
    add({"sgd_momentum",
         "sgd_momentum",
         fmt::format("P{}_{}", n, k),
         {{"momentum", 0.9f}},
         {f32({n, k}), f32({n, k}), f32({n, k}), f32(Shape{})},
         nullptr});
    // AdamW's update of the same weights (the --optimizer adamw recipe, the autoencoder), at its
    // first step, the second moment 0.25 everywhere.
    add({"adamw",
         "adamw",
         fmt::format("P{}_{}", n, k),
         {{"weight_decay", 0.01}},
         {f32({n, k}),
          f32({n, k}),
          f32({n, k}),
          {.shape = Shape{n, k}, .value = 0.25},
          f32(Shape{}),
          {.shape = Shape{}, .dtype = DType::I64, .value = 1.0}},
         nullptr});
  }

  // The same forward product with the bias and ReLU fused into the node, as the fusion pass
  // leaves a layer followed by ReLU. Its cost counts the product only.
  void matmul_bias_relu(int64_t m, int64_t k, int64_t n) {
    add({"matmul_bias_relu_fwd",
         "matmul",
         fmt::format("M{}_K{}_N{}", m, k, n),
         {{"activation", std::string("relu")}, {"trans_b", true}},
         {f32({m, k}), f32({n, k}), f32({n})},
         op_flops});
  }

  // conv2d x[n,c,h,w] * w[k,c,r,r] (stride 1, zero padding `pad`), both halves of its backward
  // (the weight gradient also with the bias gradient fused), and the forward with bias and ReLU
  // fused (every convolution of the models is followed by ReLU).
  // With `blocked`, the forward and both backward passes also with the activations in oneDNN's
  // blocked layout ("_blocked"), as propagate-layouts lays them out between convolutions (the
  // weights stay plain): the layout in which the native 16-channel kernels run.
  void conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t pad,
            bool blocked = false) {
    const std::string s = fmt::format("N{}_C{}_H{}_W{}_K{}_R{}", n, c, h, w, k, r);
    const int64_t oh = h + 2 * pad - r + 1, ow = w + 2 * pad - r + 1;
    const Ints stride{1, 1}, padding{pad, pad};
    if (blocked) {
      add({"conv2d_fwd_blocked",
           "conv2d",
           s,
           {{"stride", stride}, {"pad", padding}},
           {f32({n, c, h, w}), f32({k, c, r, r})},
           op_flops,
           Storage::Blocked});
      add({"conv2d_bwd_data_blocked",
           "conv2d_bwd_data",
           s,
           {{"stride", stride}, {"pad", padding}, {"in_shape", Ints{n, c, h, w}}},
           {f32({n, k, oh, ow}), f32({k, c, r, r})},
           op_flops,
           Storage::Blocked});
      add({"conv2d_bwd_weights_blocked",
           "conv2d_bwd_weights",
           s,
           {{"stride", stride}, {"pad", padding}, {"kernel", Ints{r, r}}},
           {f32({n, k, oh, ow}), f32({n, c, h, w})},
           op_flops,
           Storage::Blocked});
    }
    add({"conv2d_fwd",
         "conv2d",
         s,
         {{"stride", stride}, {"pad", padding}},
         {f32({n, c, h, w}), f32({k, c, r, r})},
         op_flops});
    add({"conv2d_bwd_data",
         "conv2d_bwd_data",
         s,
         {{"stride", stride}, {"pad", padding}, {"in_shape", Ints{n, c, h, w}}},
         {f32({n, k, oh, ow}), f32({k, c, r, r})},
         op_flops});
    add({"conv2d_bwd_weights",
         "conv2d_bwd_weights",
         s,
         {{"stride", stride}, {"pad", padding}, {"kernel", Ints{r, r}}},
         {f32({n, k, oh, ow}), f32({n, c, h, w})},
         op_flops});
    // The weight gradient with the bias gradient in the same pass, as training runs it
    // (fuse-bias-into-weight-gradient); its cost counts the product only.
    add({"conv2d_bwd_weights_bias",
         "conv2d_bwd_weights_bias",
         s,
         {{"stride", stride}, {"pad", padding}, {"kernel", Ints{r, r}}},
         {f32({n, k, oh, ow}), f32({n, c, h, w})},
         op_flops});
    add({"conv2d_bias_relu_fwd",
         "conv2d",
         s,
         {{"stride", stride}, {"pad", padding}, {"activation", std::string("relu")}},
         {f32({n, c, h, w}), f32({k, c, r, r}), f32({k})},
         op_flops});
  }

  // A first layer's weight and bias gradients through the backward of the r x r max pooling
  // after it (stride r), as fuse-pool-backward-into-weight-gradient leaves them: the pooling's
  // output gradient and argmax (made by max_pool2d over random values of the convolution's
  // output), x [n,c,h,w]. Compare with the pair it replaces, the conv2d_bwd_weights_bias and
  // max_pool2d_bwd rows of the same shapes. Its cost counts the convolution's product.
  void pooled_weight_gradient(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r,
                              int64_t pad, int64_t pool) {
    const Shape y{n, k, h + 2 * pad - r + 1, w + 2 * pad - r + 1};
    const Input argmax = pool_argmax(y, pool);
    add({"conv2d_bwd_weights_bias_pooled",
         "conv2d_bwd_weights_bias_pooled",
         fmt::format("N{}_C{}_H{}_W{}_K{}_R{}_P{}", n, c, h, w, k, r, pool),
         {{"stride", Ints{1, 1}},
          {"pad", Ints{pad, pad}},
          {"kernel", Ints{r, r}},
          {"pool_kernel", Ints{pool, pool}},
          {"pool_stride", Ints{pool, pool}}},
         {f32(argmax.shape), argmax, f32({n, c, h, w})},
         op_flops});
  }

  // bias_add over dimension 1 of x and its backward (the bias gradient).
  void bias(const Shape& x) {
    add({"bias_add_fwd", "bias_add", nchw_label(x), {}, {f32(x), f32({x[1]})}, nullptr});
    add({"bias_add_bwd", "bias_add_bwd", nchw_label(x), {}, {f32(x)}, nullptr});
  }

  // A smooth activation (sigmoid, tanh) and its backward from the output, dx = f(dy, y).
  void activation(const std::string& op, const Shape& x) {
    add({op + "_fwd", op, nchw_label(x), {}, {f32(x)}, nullptr});
    add({op + "_bwd", op + "_bwd", nchw_label(x), {}, {f32(x), f32(x)}, nullptr});
  }

  void relu(const Shape& x) {
    add({"relu_fwd", "relu", nchw_label(x), {}, {f32(x)}, nullptr});
    add({"relu_bwd", "relu_bwd", nchw_label(x), {}, {f32(x), f32(x)}, nullptr});
  }

  // max_pool2d with an r x r window and stride r over x, and its backward from the argmax that
  // the forward op computes on random x.
  // Also with every value in oneDNN's blocked layout ("_blocked": f32, as between the f32
  // convolutions; nChw8c for 8 channels) and stored as bf16 in the bf16 convolutions' layout
  // ("_bf16act"), and with only x (dx) blocked ("_blocked_to_plain": pool2 before the flatten).
  void pool(const Shape& x, int64_t r) {
    const std::string s = fmt::format("{}_R{}", nchw_label(x), r);
    const ir::Attrs a{{"kernel", Ints{r, r}}};
    ir::Attrs bwd = a;
    bwd.set("in_shape", x.dims());
    const Shape y{x[0], x[1], x[2] / r, x[3] / r};
    const Input argmax = pool_argmax(x, r);
    const std::pair<Storage, const char*> storages[] = {
        {Storage::Plain, ""},
        {Storage::Blocked, "_blocked"},
        {Storage::Bf16, "_bf16act"},
        {Storage::BlockedToPlain, "_blocked_to_plain"}};
    for (const auto& [storage, suffix] : storages) {
      add({fmt::format("max_pool2d_fwd{}", suffix),
           "max_pool2d",
           s,
           a,
           {f32(x)},
           nullptr,
           storage});
      add({fmt::format("max_pool2d_bwd{}", suffix),
           "max_pool2d_bwd",
           s,
           bwd,
           {f32(y), argmax},
           nullptr,
           storage});
    }
  }

  void loss(int64_t n, int64_t classes) {
    const std::string s = fmt::format("N{}_C{}", n, classes);
    add({"softmax_cross_entropy_fwd",
         "softmax_cross_entropy",
         s,
         {},
         {f32({n, classes}), labels(n, classes)},
         nullptr});
    add({"softmax_cross_entropy_bwd",
         "softmax_cross_entropy_bwd",
         s,
         {},
         {f32(Shape{}), f32({n, classes}), labels(n, classes)},
         nullptr});
  }

 private:
  std::set<std::string> names_;
};

std::vector<Case> model_cases() {
  Table t;
  // MNIST MLP 784-256-128-10, batch 64 (report 000).
  t.matmul(64, 784, 256);
  t.matmul_bias_relu(64, 784, 256);
  t.bias({64, 256});
  t.relu({64, 256});
  t.matmul(64, 256, 128);
  t.matmul_bias_relu(64, 256, 128);
  t.bias({64, 128});
  t.relu({64, 128});
  t.matmul(64, 128, 10);
  t.bias({64, 10});
  t.loss(64, 10);
  // MNIST CNN, batch 32 (report 004): conv 8 3x3 -> ReLU -> max-pool 2 -> linear 1352-10.
  t.conv(32, 1, 28, 28, 8, 3, 0);
  t.pooled_weight_gradient(32, 1, 28, 28, 8, 3, 0, 2);
  t.bias({32, 8, 26, 26});
  t.relu({32, 8, 26, 26});
  t.pool({32, 8, 26, 26}, 2);
  t.matmul(32, 1352, 10);
  t.bias({32, 10});
  t.loss(32, 10);
  // CIFAR-10 CNN, batch 32 (report 002): conv 32 3x3 pad 1 -> ReLU -> max-pool 2 -> conv 64 3x3
  // pad 1 -> ReLU -> max-pool 2 -> linear 4096-256 -> ReLU -> linear 256-10.
  t.conv(32, 3, 32, 32, 32, 3, 1);
  t.pooled_weight_gradient(32, 3, 32, 32, 32, 3, 1, 2);
  t.bias({32, 32, 32, 32});
  t.relu({32, 32, 32, 32});
  t.pool({32, 32, 32, 32}, 2);
  t.conv(32, 32, 16, 16, 64, 3, 1);
  t.bias({32, 64, 16, 16});
  t.relu({32, 64, 16, 16});
  t.pool({32, 64, 16, 16}, 2);
  t.matmul(32, 4096, 256);
  t.matmul_bias_relu(32, 4096, 256);
  t.bias({32, 256});
  t.relu({32, 256});
  t.matmul(32, 256, 10);
  // The autoencoder's output (sigmoid over 64 x 784), LeNet-5's first activation (tanh over 6
  // channels of 28x28, batch 32) and exp, which losses written from ops call, on the first.
  t.activation("sigmoid", {64, 784});
  t.activation("tanh", {32, 6, 28, 28});
  t.add({"exp_fwd", "exp", "N64_C784", {}, {f32({64, 784})}, nullptr});
  // ResNet-20 (examples/cifar_resnet), batch 128: the 3x3 stride-1 convolutions of its three
  // stages (16, 32 and 64 channels at 32x32, 16x16 and 8x8).
  t.conv(128, 16, 32, 32, 16, 3, 1, true);
  t.conv(128, 32, 16, 16, 32, 3, 1, true);
  t.conv(128, 64, 8, 8, 64, 3, 1, true);
  return std::move(t.cases);
}

// ---- the routine ------------------------------------------------------------------------------

/// A one-node graph of case c: inputs in0, in1, ... and every output of the node a graph output.
struct OneNode {
  ir::Graph g;
  ir::Node* node = nullptr;
  OneNode(const std::string& op, const ir::Attrs& attrs, const std::vector<Shape>& shapes,
          const std::vector<DType>& dtypes, const std::string& name) {
    std::vector<ir::Value*> in;
    for (std::size_t i = 0; i < shapes.size(); ++i)
      in.push_back(ops::input(g, fmt::format("in{}", i), shapes[i], dtypes[i]));
    node = ops::apply_node(op, std::move(in), attrs, name);
    for (ir::Value* v : node->outputs()) g.add_output(v);
  }
};

void fill_normal(const Tensor& t, std::uint64_t stream) {
  Tensor view = t;
  CounterRng(kSeed).fill_normal(view, stream, 0.0f, 1.0f);
}

/// N(0,1) values rounded to bf16 (ties to even), into a tensor stored as bf16.
void fill_normal_bf16(const Tensor& t, std::uint64_t stream) {
  Tensor f = Tensor::empty(t.shape());
  fill_normal(f, stream);
  auto* out = static_cast<std::uint16_t*>(t.raw());
  const float* in = f.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    std::uint32_t u = 0;
    std::memcpy(&u, &in[i], sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
}

void apply_storage(ir::Node& n, Storage storage);

void fill_input(const Tensor& t, const Input& in, std::uint64_t stream,
                Storage storage = Storage::Plain) {
  if (in.value && t.dtype() == DType::I64) {
    std::fill_n(t.data<std::int64_t>(), t.numel(), static_cast<std::int64_t>(*in.value));
  } else if (in.value && t.dtype() == DType::F32) {
    std::fill_n(t.data<float>(), t.numel(), static_cast<float>(*in.value));
  } else if (t.dtype() == DType::BF16) {
    fill_normal_bf16(t, stream);
  } else if (in.classes > 0) {
    const CounterRng rng(kSeed);
    std::int32_t* p = t.data<std::int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i)
      p[i] =
          static_cast<std::int32_t>(rng.bits(stream, i) % static_cast<std::uint64_t>(in.classes));
  } else if (!in.from.empty()) {
    // Made in the case's storage, so that it lies where the case's node reads it.
    OneNode src(in.from, in.from_attrs, in.from_shapes,
                std::vector<DType>(in.from_shapes.size(), DType::F32), in.from);
    apply_storage(*src.node, storage);
    runtime::Executable exe(src.g, {.backend = ir::Backend::Native});
    for (std::size_t i = 0; i < in.from_shapes.size(); ++i)
      fill_input(exe.input(fmt::format("in{}", i)), f32(in.from_shapes[i]), stream * 16 + i);
    exe.run();
    const Tensor& out = exe.value(src.node->output(in.output));
    MINIDL_CHECK(out.shape() == t.shape() && out.dtype() == t.dtype(), in.from, " output ",
                 in.output, " is ", out.shape(), " ", out.dtype(), ", the input needs ", t.shape(),
                 " ", t.dtype());
    std::memcpy(t.raw(), out.raw(), t.nbytes());
  } else {
    fill_normal(t, stream);
  }
}

/// The kernel the executable chose for its only node, from its kernel table ("<node> -> label").
const ir::KernelDef& chosen_kernel(const runtime::Executable& exe, const ir::Node& node) {
  std::istringstream lines(exe.kernel_table());
  std::string line, name;
  int steps = 0;
  while (std::getline(lines, line)) {
    const auto at = line.rfind(" -> ");
    MINIDL_CHECK(at != std::string::npos, "unexpected kernel table line '", line, "'");
    name = line.substr(at + 4);
    ++steps;
  }
  MINIDL_CHECK(steps == 1, "expected one kernel for ", node.describe(), ", the table has ", steps,
               ":\n", exe.kernel_table());
  // The table shows the kernel's label: its name, with " bf16" when it computes in bf16.
  for (const ir::KernelDef& k : node.def().kernels())
    if (ir::kernel_label(node, k) == name) return k;
  MINIDL_FAIL(node.describe(), " got kernel '", name, "', which its op does not declare");
}

/// Why no kernel of backend `want` runs node n: the reasons its kernels gave, or that it has none.
std::string declined(const ir::Node& n, ir::Backend want, const ir::KernelDef& got) {
  std::string why;
  for (const ir::KernelDef& k : n.def().kernels()) {
    std::string reason;
    if (k.backend != want || k.supports == nullptr || k.supports(n, &reason)) continue;
    why += fmt::format("{}{} declined: {}", why.empty() ? "" : "; ", k.name, reason);
  }
  if (why.empty()) {
    why = want == ir::Backend::OneDnn && !MINIDL_WITH_ONEDNN
              ? std::string("built without oneDNN (MINIDL_WITH_ONEDNN=OFF)")
              : fmt::format("{} has no {} kernel", n.op(), ir::backend_name(want));
  }
  return fmt::format("{} (the node would run the {} kernel)", why, got.name);
}

/// What case c needs that its op does not declare in this build (an attribute or an input that
/// is still to come), or empty.
std::string missing_in_schema(const Case& c) {
  const ir::OpDef& def = ops::op(c.op);
  for (const auto& [name, value] : c.attrs.items()) {
    bool declared = false;
    for (const ir::AttrDecl& d : def.attr_decls()) declared = declared || d.name == name;
    if (!declared) return fmt::format("{} has no attribute '{}' in this build", c.op, name);
  }
  if (c.inputs.size() > def.input_names().size()) {
    return fmt::format("{} takes at most {} inputs in this build, the case has {}", c.op,
                       def.input_names().size(), c.inputs.size());
  }
  return {};
}

/// The layout of `storage` for values of `channels` channels: oneDNN's f32 blocking, in blocks of
/// 8 (nChw8c) when the channels do not fill blocks of 16, as the MNIST CNN's 8 do; the bf16
/// convolutions' layout for Bf16.
std::string storage_layout(Storage storage, int64_t channels) {
  if (storage == Storage::Bf16) return ops::bf16_layout();
  const std::string& blocked = ops::blocked_layout();
  if (blocked == "nChw16c" && channels % 16 != 0 && channels % 8 == 0) return "nChw8c";
  return blocked;
}

/// Lays out (and, for Bf16, stores as bf16) every 4-D value of n as `storage` says; i32 values
/// take the layout only.
void apply_storage(ir::Node& n, Storage storage) {
  if (storage == Storage::Plain) return;
  const std::string layout = storage_layout(storage, n.input(0)->shape()[1]);
  std::vector<ir::Value*> values(n.inputs().begin(), n.inputs().end());
  values.insert(values.end(), n.outputs().begin(), n.outputs().end());
  if (storage == Storage::BlockedToPlain) {
    values = n.op().ends_with("_bwd")
                 ? std::vector<ir::Value*>(n.outputs().begin(), n.outputs().end())
                 : std::vector<ir::Value*>(n.inputs().begin(), n.inputs().end());
  }
  // A convolution's weights "w" and their gradient "dw" stay plain, as in training.
  std::vector<const ir::Value*> weights;
  for (std::size_t i = 0; i < n.inputs().size(); ++i)
    if (n.def().input_names()[i] == "w") weights.push_back(n.input(static_cast<int>(i)));
  for (std::size_t i = 0; i < n.outputs().size(); ++i)
    if (n.def().output_names()[i] == "dw") weights.push_back(n.output(static_cast<int>(i)));
  for (ir::Value* v : values) {
    if (v->shape().rank() != 4 || std::count(weights.begin(), weights.end(), v) > 0) continue;
    v->set_layout(layout);
    if (storage == Storage::Bf16 && v->dtype() == DType::F32) v->set_stored(DType::BF16);
  }
}

/// Why the case's storage cannot be had here, or "".
std::string storage_missing(Storage storage, const Case& c) {
  if (storage != Storage::Plain) {
    const std::string layout = storage_layout(storage, c.inputs[0].shape[1]);
    const int64_t channels = c.inputs[0].shape[1];
    if (!layout.empty() && channels % ir::channel_block(layout) != 0)
      return fmt::format("{} channels do not fill blocks of {} ({})", channels,
                         ir::channel_block(layout), layout);
  }
  if ((storage == Storage::Blocked || storage == Storage::BlockedToPlain) &&
      ops::blocked_layout().empty())
    return "oneDNN's convolutions use no blocked layout on this CPU (or no oneDNN)";
  if (storage == Storage::Bf16) {
    if (std::string why = ops::bf16_unavailable(); !why.empty()) return "bf16 " + why;
    if (ops::bf16_layout().empty())
      return "oneDNN's bf16 convolutions use no layout minidl names on this CPU";
  }
  return {};
}

/// How a case runs: in f32, on bf16 factors (the node marked bf16), or also with its
/// activations stored as bf16.
enum class Variant { F32, Bf16, Bf16Activations };

struct Flavour {
  ir::Backend backend;
  Variant variant;
  std::string name;  // the benchmark name's middle part, as scripts/bench reads it
  /// The node's "algorithm" annotation: a oneDNN convolution's direct or Winograd kernel,
  /// whichever the default row does not run.
  std::string algorithm = {};
};

/// Why the variant cannot run here, or "": bf16 needs the CPU's bf16 units (as oneDNN sees
/// them) and, for a convolution's stored activations, a layout of the bf16 convolutions.
std::string bf16_missing(Variant v, const std::string& op) {
  if (v == Variant::F32) return {};
  if (std::string why = ops::bf16_unavailable(); !why.empty()) return "bf16 " + why;
  if (v == Variant::Bf16Activations && op.starts_with("conv2d") && ops::bf16_layout().empty())
    return "oneDNN's bf16 convolutions use no layout minidl names on this CPU";
  return {};
}

/// Marks the node bf16 and, for Bf16Activations, stores its 4-D activations (not the weights "w"
/// or their gradient "dw") as bf16 in the bf16 convolutions' layout (a pooling's i32 argmax
/// takes the layout only); as under --precision bf16,
/// an activation whose channels do not fill that layout's blocks (the 1-channel image with
/// AVX512-BF16's nChw16c) stays f32 and plain. A product's factors "a" and "b" are stored as
/// bf16 (plain), as the shared copies of --precision bf16 give them.
void apply_variant(ir::Node& n, Variant v) {
  if (v == Variant::F32) return;
  n.annotations().set("precision", std::string("bf16"));
  if (v != Variant::Bf16Activations) return;
  auto store = [](ir::Value* value, const std::string& name) {
    if (value->shape().rank() == 2 && (name == "a" || name == "b")) {
      value->set_stored(DType::BF16);
      return;
    }
    if (value->shape().rank() != 4 || name == "w" || name == "dw") return;
    if (value->shape()[1] % ir::channel_block(ops::bf16_layout()) != 0) return;
    value->set_layout(ops::bf16_layout());
    if (value->dtype() == DType::F32) value->set_stored(DType::BF16);  // an argmax: the layout
  };
  for (std::size_t i = 0; i < n.inputs().size(); ++i)
    store(n.input(static_cast<int>(i)), n.def().input_names()[i]);
  for (std::size_t i = 0; i < n.outputs().size(); ++i)
    store(n.output(static_cast<int>(i)), n.def().output_names()[i]);
}

void run_case(benchmark::State& state, const Case& c, const Flavour& f) {
  const ir::Backend backend = f.backend;
  try {
    if (const std::string missing = bf16_missing(f.variant, c.op); !missing.empty()) {
      state.SkipWithError(missing.c_str());
      return;
    }
    if (f.variant != Variant::F32) {
      const auto& kernels = ops::op(c.op).kernels();
      if (std::none_of(kernels.begin(), kernels.end(),
                       [&](const ir::KernelDef& k) { return k.backend == backend && k.bf16; })) {
        state.SkipWithError(
            fmt::format("no {} kernel of {} computes in bf16", ir::backend_name(backend), c.op)
                .c_str());
        return;
      }
    }
    if (const std::string missing = missing_in_schema(c); !missing.empty()) {
      state.SkipWithError(missing.c_str());
      return;
    }
    if (const std::string missing = storage_missing(c.storage, c); !missing.empty()) {
      state.SkipWithError(missing.c_str());
      return;
    }
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    for (const Input& in : c.inputs) shapes.push_back(in.shape), dtypes.push_back(in.dtype);
    OneNode one(c.op, c.attrs, shapes, dtypes, c.bench);
    apply_variant(*one.node, f.variant);
    apply_storage(*one.node, c.storage);
    if (!f.algorithm.empty()) one.node->annotations().set("algorithm", f.algorithm);
    // Pinned to the row's backend: a kernel declared preferred (OpDef::preferred) would
    // otherwise run under every backend's name.
    one.node->annotations().set("backend", std::string(ir::backend_name(backend)));
    runtime::Executable exe(one.g, {.backend = backend});
    const ir::KernelDef& kernel = chosen_kernel(exe, *one.node);
    if (kernel.backend != backend) {
      state.SkipWithError(declined(*one.node, backend, kernel).c_str());
      return;
    }
    const std::string label = ir::kernel_label(*one.node, kernel);
#if MINIDL_WITH_ONEDNN
    if (f.algorithm == "winograd" && !ops::onednn::conv2d_winograd(*one.node)) {
      state.SkipWithError("oneDNN has no Winograd kernel for this convolution on this CPU");
      return;
    }
#endif
    if (f.variant != Variant::F32 && !kernel.bf16) {
      state.SkipWithError(fmt::format("the {} kernel of {} has no bf16 path (it would run in f32)",
                                      kernel.name, c.op)
                              .c_str());
      return;
    }
    for (std::size_t i = 0; i < c.inputs.size(); ++i)
      fill_input(exe.input(fmt::format("in{}", i)), c.inputs[i], i, c.storage);
    exe.run();  // first touch of the buffers and oneDNN's first execution, outside the timing
    for (auto _ : state) exe.run();
    if (c.flops) {
      state.counters["FLOP/s"] =
          benchmark::Counter(c.flops(*one.node), benchmark::Counter::kIsIterationInvariantRate);
    } else {
      state.counters["bytes/s"] =
          benchmark::Counter(bytes_moved(*one.node), benchmark::Counter::kIsIterationInvariantRate);
    }
    state.SetLabel(label);
  } catch (const std::exception& e) {
    count_failure();
    state.SkipWithError(fmt::format("failed: {}", e.what()).c_str());
  }
}

}  // namespace

void register_op_benchmarks() {
  using ir::Backend;
  for (const Case& c : model_cases()) {
    auto shared = std::make_shared<const Case>(c);
    std::vector<Flavour> flavours = {{Backend::Native, Variant::F32, "native"},
                                     {Backend::OneDnn, Variant::F32, "onednn"}};
    // oneDNN's convolutions also with each algorithm (the default takes Winograd's for 3x3
    // stride-1 layers between at least 32 channels).
    if (c.op.starts_with("conv2d")) {
      flavours.push_back({Backend::OneDnn, Variant::F32, "onednn_direct", "direct"});
      flavours.push_back({Backend::OneDnn, Variant::F32, "onednn_winograd", "winograd"});
    }
    // Products and convolutions (the cases with a FLOP count) in mixed precision too.
    if (c.flops && c.storage == Storage::Plain) {
      flavours.push_back({Backend::Native, Variant::Bf16, "native_bf16"});
      flavours.push_back({Backend::OneDnn, Variant::Bf16, "onednn_bf16"});
      if (c.op.starts_with("conv2d") || c.op.starts_with("matmul")) {
        flavours.push_back({Backend::Native, Variant::Bf16Activations, "native_bf16act"});
        flavours.push_back({Backend::OneDnn, Variant::Bf16Activations, "onednn_bf16act"});
      }
    }
    for (const Flavour& f : flavours) {
      const std::string name = bench_name(c.bench, f.name, c.shape);
      configure(benchmark::RegisterBenchmark(
          name.c_str(), [shared, f](benchmark::State& s) { run_case(s, *shared, f); }));
    }
  }
}

}  // namespace minidl::bench
