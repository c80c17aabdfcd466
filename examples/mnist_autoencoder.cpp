// An MNIST autoencoder: 784-128-32-128-784 (ReLU between, a sigmoid on the reconstruction),
// trained to reproduce its input under the mean squared error with AdamW (learning rate 1e-3)
// and a cosine schedule, batch 64, 5 epochs. He initialisation for the layers followed by ReLU,
// Xavier for the output layer. The same program as the classifiers: any rank x thread layout,
// checkpoints, --deterministic; the loss's target is the image itself.
#include "minidl/frontend/app.hpp"

using namespace minidl;

int main(int argc, char** argv) {
  AppConfig defaults;
  defaults.epochs = 5;
  defaults.optimizer = "adamw";
  defaults.lr = 1e-3;
  defaults.lr_schedule = "cosine";
  defaults.loss = "mse";
  defaults.losses = {"mse"};
  defaults.reconstruct = true;
  return run_training_app(argc, argv, "Train an autoencoder on MNIST or Fashion-MNIST", defaults,
                          [](const AppConfig&, const Shape& sample) {
                            const std::int64_t pixels = sample.numel();
                            auto model = std::make_unique<nn::Sequential>();
                            model->emplace<nn::Flatten>("flatten");
                            model->emplace<nn::Linear>("fc1", pixels, 128, nn::Init::He);
                            model->emplace<nn::ReLU>("relu1");
                            model->emplace<nn::Linear>("fc2", 128, 32, nn::Init::He);
                            model->emplace<nn::ReLU>("relu2");
                            model->emplace<nn::Linear>("fc3", 32, 128, nn::Init::He);
                            model->emplace<nn::ReLU>("relu3");
                            model->emplace<nn::Linear>("fc4", 128, pixels, nn::Init::Xavier);
                            model->emplace<nn::Sigmoid>("sigmoid");
                            return model;
                          });
}
