// A new layer added from outside the library, in this one file: GELU (the exact, erf form that
// PyTorch's nn.GELU() computes), y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). The file holds
// everything a layer needs, in the order docs/adding-a-layer.md walks through them:
//   1. the op: its shape rule, its native OpenMP kernel and its gradient rule (MINIDL_OP), and
//      the backward op that rule adds (gelu_bwd);
//   2. registration with ops::register_op, since the generated op table only lists ops/;
//   3. a builder, custom::gelu(x), and an nn::Module wrapper, custom::Gelu;
//   4. a self-test (--self-test, run by ctest): the kernel against the formula, the gradient
//      against finite differences, refused bad inputs, a few training steps on synthetic data;
//   5. main: without --self-test, the mnist_mlp program with GELU in place of ReLU.
//
//   custom_layer --self-test
//   custom_layer --epochs 5 --hidden 256,128 [every flag of mnist_mlp]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <numbers>
#include <string>
#include <vector>

#include "minidl/app/app.hpp"
#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"

using namespace minidl;

namespace custom {

// ---- 1. The op ---------------------------------------------------------------------------------

// Phi(x), the standard normal CDF, and its density phi(x).
inline float normal_cdf(float x) {
  return 0.5f * (1.0f + std::erf(x * std::numbers::sqrt2_v<float> / 2));
}
inline float normal_pdf(float x) {
  return std::exp(-0.5f * x * x) *
         (std::numbers::inv_sqrtpi_v<float> / std::numbers::sqrt2_v<float>);
}

// Shape rule, run when a node is added: f32 in, the same shape out. MINIDL_CHECK_NODE's error
// names the op, the node and the input shapes, e.g. "gelu 'act1.gelu' (%7): ...; x=[64,256]".
void gelu_infer(ir::InferCtx& c) {
  MINIDL_CHECK_NODE(c, c.dtype(0) == DType::F32, "expected f32 input, got ", c.dtype(0));
  c.set_output(0, c.input(0));
}

// gelu_bwd(dy, x) -> dx: both f32 of one shape.
void gelu_bwd_infer(ir::InferCtx& c) {
  for (int i = 0; i < 2; ++i)
    MINIDL_CHECK_NODE(c, c.dtype(i) == DType::F32, "input ", i, " must be f32, got ", c.dtype(i));
  MINIDL_CHECK_NODE(c, c.input(1) == c.input(0), "dy ", c.input(0), " and x ", c.input(1),
                    " must have the same shape");
  c.set_output(0, c.input(0));
}

// Native kernels: src [any] -> dst [same]. ops::map_unary / map_binary split the elements over
// the OpenMP threads (serially below a size where a fork costs more than it saves).
void gelu_native(const ir::KernelArgs& k) {
  ops::map_unary(k, [](float x) { return x * normal_cdf(x); });
}

// d/dx x Phi(x) = Phi(x) + x phi(x). The backward reads x, not y: GELU is not monotonic, so y
// does not determine x.
void gelu_bwd_native(const ir::KernelArgs& k) {
  ops::map_binary(k, [](float dy, float x) { return dy * (normal_cdf(x) + x * normal_pdf(x)); });
}

// The backward op comes first: gelu's gradient rule names it by its object, op_gelu_bwd.
MINIDL_OP(gelu_bwd)
    .inputs({"dy", "x"})
    .outputs({"dx"})
    .infer(gelu_bwd_infer)
    .kernel(ir::Backend::Native, gelu_bwd_native)
    .no_grad("backward-only op; second derivatives are not supported");

// The gradient rule adds graph nodes: dx = gelu_bwd(dy, x).
void gelu_grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_gelu_bwd, {g.out_grad(0), g.input(0)}));
}

MINIDL_OP(gelu)
    .inputs({"x"})
    .infer(gelu_infer)
    .kernel(ir::Backend::Native, gelu_native)
    .grad(gelu_grad);

// ---- 2. Registration ---------------------------------------------------------------------------

// Once per process, before the first node of the op is added. The builder below calls it, so
// code that builds graphs through it cannot forget.
void register_gelu() {
  static std::once_flag once;
  std::call_once(once, [] {
    ops::register_op(op_gelu);
    ops::register_op(op_gelu_bwd);
  });
}

// ---- 3. Builder and layer ----------------------------------------------------------------------

/// y = GELU(x), a node added after x.
ir::Value* gelu(ir::Value* x, std::string node_name = {}) {
  register_gelu();
  return ops::apply_node("gelu", {x}, {}, std::move(node_name))->output();
}

/// The layer: no parameters, one gelu node, named "act1.gelu" in a child called "act1" (a
/// container calls its child as child(x), which names the child's nodes after it).
class Gelu final : public nn::Module {
 public:
  ir::Value* forward(ir::Value* x) override { return gelu(x); }
  std::string describe() const override { return "GELU"; }
};

}  // namespace custom

// ---- 4. Self-test ------------------------------------------------------------------------------

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// GELU in double, straight from the definition.
double gelu_reference(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// The kernel against the formula: a few points with known values, and 100000 random values (so
// that the kernel runs split over threads).
void test_forward() {
  // x Phi(x) at x = 1, -1, 2, 0.5 from the standard normal table (to 10 digits).
  const std::vector<std::pair<float, double>> known = {
      {1.0f, 0.8413447461}, {-1.0f, -0.1586552539}, {2.0f, 1.9544997361}, {0.5f, 0.3457312306},
      {0.0f, 0.0},          {-8.0f, 0.0},           {8.0f, 8.0}};
  ir::Graph g;
  Tensor x = Tensor::empty({100000});
  CounterRng(5).fill_normal(x, 0, 0.0f, 3.0f);
  for (std::size_t i = 0; i < known.size(); ++i) x.data<float>()[i] = known[i].first;
  ir::Value* y = custom::gelu(ops::parameter(g, "x", x));
  g.add_output(y);
  runtime::Executable exe(g);
  exe.run();
  const Tensor& out = exe.value(y);
  double worst_known = 0.0, worst = 0.0;
  for (std::size_t i = 0; i < known.size(); ++i)
    worst_known = std::max(worst_known, std::fabs(out.at(i) - known[i].second));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double ref = gelu_reference(x.at(i));
    worst = std::max(worst, std::fabs(out.at(i) - ref) / (1.0 + std::fabs(ref)));
  }
  check(worst_known < 1e-6, fmt::format("gelu at known points (max error {:.2e})", worst_known));
  check(worst < 1e-6,
        fmt::format("gelu against the formula on {} values (max error {:.2e})", x.numel(), worst));
}

// The gradient rule against central finite differences of L = sum(gelu(x) * w), L evaluated in
// double from the kernel's output: the check autograd::check_gradients runs for every op.
void test_gradient() {
  ir::Graph g;
  Tensor x = Tensor::empty({6, 11}), w = Tensor::empty({6, 11});
  CounterRng(7).fill_normal(x, 0, 0.0f, 2.0f);
  CounterRng(7).fill_uniform(w, 1, -1.0f, 1.0f);
  ir::Value* xv = ops::parameter(g, "x", x);
  ir::Value* y = custom::gelu(xv);
  ir::Value* loss = ops::sum(ops::mul(y, ops::parameter(g, "w", w)));
  g.add_output(y);
  g.add_output(loss);
  ir::Value* dx = autograd::differentiate(g, loss, {xv})[0];
  g.add_output(dx);
  runtime::Executable exe(g);
  exe.run();
  std::vector<Tensor> params{x};
  std::vector<Tensor> analytic{exe.value(dx).clone()};
  const auto r = autograd::check_gradients(params, analytic, [&] {
    exe.run();
    const Tensor& out = exe.value(y);
    double l = 0.0;
    for (std::int64_t i = 0; i < out.numel(); ++i) l += double{out.at(i)} * w.at(i);
    return l;
  });
  check(r.ok, fmt::format("gradient against finite differences (max scaled error {:.2e}){}",
                          r.max_error, r.ok ? "" : "\n" + r.report));
}

// Bad inputs are refused when the node is added, naming the op, the node and the problem; an op
// name cannot be registered twice.
void test_bad_inputs() {
  auto refused = [](const std::string& what, const std::vector<std::string>& expect, auto&& build) {
    try {
      build();
      check(false, what + ": accepted");
    } catch (const Error& e) {
      const std::string msg = e.what();
      bool ok = true;
      for (const std::string& piece : expect) ok &= msg.find(piece) != std::string::npos;
      check(ok, what + ": \"" + msg + "\"");
    }
  };
  refused("i32 input refused", {"gelu 'bad_gelu'", "expected f32 input, got i32", "[4]"}, [] {
    ir::Graph g;
    custom::gelu(ops::input(g, "labels", {4}, DType::I32), "bad_gelu");
  });
  refused("gelu_bwd with shapes that differ refused",
          {"gelu_bwd 'bad_bwd'", "must have the same shape", "[2,3]", "[3,2]"}, [] {
            ir::Graph g;
            ops::apply_node("gelu_bwd", {ops::input(g, "dy", {2, 3}), ops::input(g, "x", {3, 2})},
                            {}, "bad_bwd");
          });
  refused("second registration refused", {"op 'gelu' is already registered"},
          [] { ops::register_op(custom::op_gelu); });
}

/// n samples of 4 classes, each a fixed random 1x4x4 pattern plus Gaussian noise.
Dataset synthetic(std::int64_t n, std::uint64_t seed) {
  Dataset d;
  d.name = "synthetic";
  d.num_classes = 4;
  d.images = Tensor::empty({n, 1, 4, 4});
  d.labels = Tensor::empty({n}, DType::I32);
  Tensor centers = Tensor::empty({4, 16}), noise = Tensor::empty({n, 16});
  CounterRng(1).fill_uniform(centers, 0, -1.0f, 1.0f);
  CounterRng(seed).fill_normal(noise, 1, 0.0f, 0.3f);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::int32_t>(CounterRng(seed).bits(2, i) % 4);
    d.labels.data<std::int32_t>()[i] = c;
    for (int j = 0; j < 16; ++j)
      d.images.data<float>()[i * 16 + j] = centers.at(c * 16 + j) + noise.at(i * 16 + j);
  }
  return d;
}

// A small MLP with the layer, trained for three epochs of 16 steps: the loss must fall.
void test_training() {
  const Dataset train = synthetic(512, 11), test = synthetic(256, 12);
  nn::Sequential model;
  model.emplace<nn::Flatten>("flatten");
  model.emplace<nn::Linear>("fc1", 16, 32, nn::Init::He);
  model.emplace<custom::Gelu>("act1");
  model.emplace<nn::Linear>("fc2", 32, 4, nn::Init::Xavier);
  model.reset(42);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.5});
  Trainer trainer(model, sgd, {.batch_size = 32, .seed = 3});
  const EvalStats before = trainer.evaluate(test);
  double first = 0.0, last = 0.0;
  for (int epoch = 1; epoch <= 3; ++epoch) {
    last = trainer.train_epoch(train, epoch).loss;
    if (epoch == 1) first = last;
  }
  const EvalStats after = trainer.evaluate(test);
  bool has_gelu = false;
  for (const ir::Node* n : trainer.training_graph(Shape{1, 4, 4}).nodes())
    has_gelu |= n->op() == "gelu" && n->name() == "act1.gelu";
  check(has_gelu, "the training graph holds the layer's node act1.gelu");
  check(after.loss < 0.5 * before.loss && last < first,
        fmt::format("training: test loss {:.4f} -> {:.4f}, train loss {:.4f} -> {:.4f}, test "
                    "accuracy {:.1f}% -> {:.1f}%",
                    before.loss, after.loss, first, last, 100 * before.accuracy,
                    100 * after.accuracy));
}

int self_test() {
  test_forward();
  test_gradient();
  test_bad_inputs();
  test_training();
  std::printf("%s\n", failures == 0 ? "custom_layer: all checks passed"
                                    : "custom_layer: some checks FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace

// ---- 5. The program ----------------------------------------------------------------------------

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--self-test") == 0) {
    try {
      return self_test();
    } catch (const Error& e) {
      std::fprintf(stderr, "custom_layer: error: %s\n", e.what());
      return 1;
    }
  }
  // mnist_mlp's program with the layer in place of the activation (--activation is ignored).
  return run_training_app(
      argc, argv, "Train an MLP with GELU, a layer defined in this file", AppConfig{},
      [](const AppConfig& c, const Shape& sample) {
        auto model = std::make_unique<nn::Sequential>();
        model->emplace<nn::Flatten>("flatten");
        std::int64_t in = sample.numel();
        int layer = 1;
        for (std::int64_t width : c.hidden_sizes()) {
          model->emplace<nn::Linear>(fmt::format("fc{}", layer), in, width, nn::Init::He);
          model->emplace<custom::Gelu>(fmt::format("act{}", layer));
          in = width;
          ++layer;
        }
        model->emplace<nn::Linear>(fmt::format("fc{}", layer), in, 10, nn::Init::Xavier);
        return model;
      });
}
