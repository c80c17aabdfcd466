// A training loop written by hand on the step compiler, without the Trainer or the app: a
// 784-128-10 MLP on MNIST with AdamW, batches shuffled and fed by the loop itself, the loss read
// back from the step, test accuracy from an evaluation program, the parameters saved as
// .safetensors; then, as a separate inference program would, a fresh model loads that file and
// classifies a few test images. It runs as one process only: its programs are compiled for one
// rank (under mpirun, compile_step refuses the layout). The data is data/mnist as
// scripts/fetch-data leaves it (checksum-checked there); the readers check the files' format.
#include <CLI/CLI.hpp>
#include <numeric>

#include "minidl/core/rng.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/io/safetensors.hpp"
#include "minidl/train/batch.hpp"
#include "minidl/train/predict.hpp"

using namespace minidl;

// The same architecture for training and for inference.
std::unique_ptr<nn::Sequential> mlp() {
  auto m = std::make_unique<nn::Sequential>();
  m->emplace<nn::Flatten>("flatten");
  m->emplace<nn::Linear>("fc1", 784, 128, nn::Init::He);
  m->emplace<nn::ReLU>("relu");
  m->emplace<nn::Linear>("fc2", 128, 10, nn::Init::Xavier);
  return m;
}

void train_and_save(const Dataset& train, const Dataset& test, int epochs,
                    const train::Augment& augment, const std::string& path) {
  auto model = mlp();
  model->reset(42);
  const train::CrossEntropy loss;
  optim::AdamW adamw({.lr = 1e-3});
  const std::int64_t batch = 64, batches = train.size() / batch;  // whole batches only
  MINIDL_CHECK(batches >= 1, "the training set has ", train.size(), " samples, fewer than a batch");
  train::CompiledStep step =
      train::compile_step(*model, loss, &adamw, {.sample = Shape{1, 28, 28}, .batch = batch}, {});
  std::int64_t steps = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const std::vector<std::int64_t> order = permutation(train.size(), mix64(epoch));
    double loss_sum = 0.0;
    for (std::int64_t b = 0; b < batches; ++b) {
      // Each sample's augmentation is drawn from (seed, epoch, its index): none by default.
      train::gather(step, train.images, train.labels, std::span(order).subspan(b * batch, batch), 0,
                    augment, {.seed = 42, .epoch = epoch});
      step.run({.lr = adamw.lr(), .step = steps++});
      loss_sum += step.loss_sum();
    }
    fmt::print("epoch {}  steps {}  train loss {:.4f}\n", epoch, steps,
               loss_sum / static_cast<double>(batches * batch));
  }
  // One evaluation program for the whole test set (37 MB of buffers for this model; a
  // larger model would evaluate in batches, as the training loop trains).
  train::CompiledStep eval =
      train::compile_step(*model, loss, nullptr,
                          {.sample = Shape{1, 28, 28}, .batch = test.size(), .train = false}, {});
  std::vector<std::int64_t> all(test.size());
  std::iota(all.begin(), all.end(), 0);
  train::gather(eval, test.images, test.labels, all);
  eval.run();
  fmt::print("test accuracy {:.2f}%\n", 100.0 * eval.correct() / test.size());
  nn::save_state_dict(*model, path);
  const auto classes = train::predicted_classes(train::predict(*model, take(test, 10).images));
  fmt::print("trained model:  {}\n", fmt::join(classes, " "));
}

// Inference alone: nothing from training but the file.
void load_and_predict(const std::string& path, const Dataset& test) {
  auto model = mlp();
  nn::load_state_dict(*model, path);
  const Dataset few = take(test, 10);
  const auto classes = train::predicted_classes(train::predict(*model, few.images));
  fmt::print("reloaded model: {}\ntrue labels:    {}\n", fmt::join(classes, " "),
             fmt::join(few.labels.span<std::int32_t>(), " "));
}

int main(int argc, char** argv) {
  std::string data = "data/mnist", save = "mnist_loop.safetensors";
  int epochs = 3;
  std::int64_t train_limit = 0;
  std::string augment = "none";
  CLI::App cli("Train an MLP on MNIST with a hand-written loop, save it, reload it, predict");
  cli.add_option("--data", data, "MNIST directory")->capture_default_str();
  cli.add_option("--epochs", epochs, "epochs")->check(CLI::Range(1, 1000))->capture_default_str();
  cli.add_option("--train-limit", train_limit, "use the first N training samples (0: all)");
  cli.add_option("--save", save, "where to save the parameters")->capture_default_str();
  cli.add_option("--augment", augment, "none, crop, flip or crop,flip (of the training images)")
      ->capture_default_str();
  CLI11_PARSE(cli, argc, argv);
  try {
    const Dataset test = load_mnist(data, "test");
    train_and_save(take(load_mnist(data, "train"), train_limit), test, epochs,
                   train::Augment::parse(augment), save);
    load_and_predict(save, test);
  } catch (const Error& e) {
    fmt::print(stderr, "mnist_loop: error: {}\n", e.what());
    return 1;
  }
}
