// An application built against the installed minidl package: a 2-layer MLP trained for a few
// epochs on synthetic data (no files), and an op of its own. Exits non-zero unless the loss
// falls (which needs the op table and the ops' kernels to have survived the static link) and the
// own op computes and differentiates right.
#include <cstdio>
#include <memory>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/error.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/optimizer.hpp"

using namespace minidl;

namespace {

/// n samples of 4 classes, each a fixed random 1x4x4 pattern plus Gaussian noise.
Dataset synthetic(std::int64_t n, std::uint64_t seed) {
  Dataset d;
  d.name = "synthetic";
  d.num_classes = 4;
  d.images = Tensor::empty({n, 1, 4, 4});
  d.labels = Tensor::empty({n}, DType::I32);
  Tensor centers = Tensor::empty({4, 16});
  CounterRng(1).fill_uniform(centers, 0, -1.0f, 1.0f);
  Tensor noise = Tensor::empty({n, 16});
  CounterRng(seed).fill_normal(noise, 1, 0.0f, 0.3f);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::int32_t>(CounterRng(seed).bits(2, i) % 4);
    d.labels.data<std::int32_t>()[i] = c;
    for (int j = 0; j < 16; ++j)
      d.images.data<float>()[i * 16 + j] = centers.at(c * 16 + j) + noise.at(i * 16 + j);
  }
  return d;
}

// An op defined here, as docs/adding-a-layer.md shows: y = x^3, dx = 3 x^2 dy.
void cube_native(const ir::KernelArgs& k) {
  ops::map_unary(k, [](float x) { return x * x * x; });
}
void cube_bwd_native(const ir::KernelArgs& k) {
  ops::map_binary(k, [](float dy, float x) { return 3 * x * x * dy; });
}
MINIDL_OP(consumer_cube_bwd)
    .inputs({"dy", "x"})
    .outputs({"dx"})
    .infer(ops::infer_same_shapes)
    .kernel(ir::Backend::Native, cube_bwd_native)
    .no_grad("backward-only op");
void cube_grad(ir::GradCtx& g) {
  g.set_input_grad(0, g.op(op_consumer_cube_bwd, {g.out_grad(0), g.input(0)}));
}
MINIDL_OP(consumer_cube)
    .inputs({"x"})
    .infer(ops::infer_unary_f32)
    .kernel(ir::Backend::Native, cube_native)
    .grad(cube_grad);

/// Registers the own op, runs it on [-2, 1, 3] and differentiates sum(y): 0 when right.
int check_own_op() {
  ops::register_op(op_consumer_cube);
  ops::register_op(op_consumer_cube_bwd);
  ir::Graph g;
  Tensor x = Tensor::from<float>({3}, {-2.0f, 1.0f, 3.0f});
  ir::Value* xv = ops::parameter(g, "x", x);
  ir::Value* y = ops::apply("consumer_cube", {xv});
  ir::Value* loss = ops::sum(y);
  g.add_output(y);
  ir::Value* dx = autograd::differentiate(g, loss, {xv})[0];
  g.add_output(dx);
  runtime::Executable exe(g);
  exe.run();
  const float want_y[] = {-8.0f, 1.0f, 27.0f}, want_dx[] = {12.0f, 3.0f, 27.0f};
  for (int i = 0; i < 3; ++i) {
    if (exe.value(y).at(i) != want_y[i] || exe.value(dx).at(i) != want_dx[i]) {
      std::fprintf(stderr, "consumer: own op at %d: y %g (want %g), dx %g (want %g)\n", i,
                   exe.value(y).at(i), want_y[i], exe.value(dx).at(i), want_dx[i]);
      return 1;
    }
  }
  std::printf("own op consumer_cube: values and gradient right\n");
  return 0;
}

int run() {
  // Ops the model needs come from the generated op table inside the static library.
  for (const char* name : {"matmul", "relu", "bias_add", "softmax_cross_entropy", "sgd"}) {
    if (ops::find_op(name) == nullptr) {
      std::fprintf(stderr, "consumer: op '%s' is missing from the installed minidl\n", name);
      return 1;
    }
  }
  if (check_own_op() != 0) return 1;
  const Dataset train = synthetic(512, 11), test = synthetic(256, 12);
  nn::Sequential model;
  model.emplace<nn::Flatten>("flatten");
  model.emplace<nn::Linear>("fc1", 16, 32, nn::Init::He);
  model.emplace<nn::ReLU>("act1");
  model.emplace<nn::Linear>("fc2", 32, 4, nn::Init::Xavier);
  model.reset(42);
  optim::Sgd sgd({.lr = 0.05, .momentum = 0.5});
  Trainer trainer(model, sgd, {.batch_size = 32, .seed = 3});
  const EvalStats before = trainer.evaluate(test);
  double first = 0.0, last = 0.0;
  for (int epoch = 1; epoch <= 3; ++epoch) {
    const EpochStats s = trainer.train_epoch(train, epoch);
    if (epoch == 1) first = s.loss;
    last = s.loss;
    std::printf("epoch %d: train loss %.4f, accuracy %.3f\n", epoch, s.loss, s.accuracy);
  }
  const EvalStats after = trainer.evaluate(test);
  std::printf("test loss %.4f -> %.4f, accuracy %.3f -> %.3f (%zu ops registered)\n", before.loss,
              after.loss, before.accuracy, after.accuracy, ops::all_ops().size());
  if (!(after.loss < 0.5 * before.loss && last < first)) {
    std::fprintf(stderr,
                 "consumer: the loss did not fall (test %.4f -> %.4f, train %.4f -> %.4f)\n",
                 before.loss, after.loss, first, last);
    return 1;
  }
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const Error& e) {
    std::fprintf(stderr, "consumer: error: %s\n", e.what());
    return 1;
  }
}
