// MNIST MLP of report 000: 784-256-128-10, ReLU, softmax cross-entropy, plain SGD, batch 64,
// learning rate 0.01, He initialisation for hidden layers and Xavier for the output, 20 epochs.
// --hidden "" gives softmax regression (report 003); --activation sigmoid with
// --dataset fashion-mnist gives report 001's network.
#include "minidl/app/app.hpp"

using namespace minidl;

int main(int argc, char** argv) {
  AppConfig defaults;  // the report's settings are AppConfig's defaults
  return run_training_app(
      argc, argv, "Train an MLP on MNIST or Fashion-MNIST", defaults,
      [](const AppConfig& c, const Shape& sample) {
        auto model = std::make_unique<nn::Sequential>();
        model->emplace<nn::Flatten>("flatten");
        std::int64_t in = sample.numel();
        // ReLU layers get He initialisation; sigmoid/tanh layers and the output get Xavier.
        const nn::Init hidden_init = c.activation == "relu" ? nn::Init::He : nn::Init::Xavier;
        int layer = 1;
        for (std::int64_t width : c.hidden_sizes()) {
          model->emplace<nn::Linear>(fmt::format("fc{}", layer), in, width, hidden_init);
          model->add(nn::make_activation(c.activation), fmt::format("act{}", layer));
          in = width;
          ++layer;
        }
        model->emplace<nn::Linear>(fmt::format("fc{}", layer), in, 10, nn::Init::Xavier);
        return model;
      });
}
