// An MNIST autoencoder: 784-128-32-128-784 (ReLU between, a sigmoid on the reconstruction),
// trained to reproduce its input under the mean squared error with AdamW (learning rate 1e-3)
// and a cosine schedule, batch 64, 5 epochs. He initialisation for the layers followed by ReLU,
// Xavier for the output layer. The same program as the classifiers: any rank x thread layout,
// checkpoints, --deterministic; the loss's target is the image itself. --png FILE writes the
// first 10 test images above their reconstructions after training.
#include "minidl/app/app.hpp"
#include "minidl/io/file.hpp"
#include "minidl/io/png.hpp"
#include "minidl/train/predict.hpp"

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
  std::string png;
  AppHooks hooks;
  hooks.flags.push_back(
      {"--png",
       "after training, write the first 10 test images above their reconstructions to "
       "FILE.png (grayscale)",
       &png, [](const std::string& path) {
         // Checked now, not after training; nothing is created.
         try {
           check_writable(path, "--png");
           return std::string();
         } catch (const Error& e) {
           return std::string(e.what()).substr(
               std::string_view("--png: ").size());  // CLI11 adds it
         }
       }});
  hooks.after_training = [&png](const AppConfig& c, nn::Module& model, const Dataset& test) {
    if (png.empty()) return;
    const Tensor images = take(test, 10).images;  // [N, 1, H, W]; the reconstructions [N, H * W]
    const std::int64_t n = images.shape()[0], h = images.shape()[2], w = images.shape()[3];
    save_png(png, image_grid({images, train::predict(model, images)}, h, w, n), "--png");
    if (!c.quiet) {
      fmt::print("mnist_autoencoder: wrote {}: {} test images above their reconstructions\n", png,
                 n);
    }
  };
  return run_training_app(
      argc, argv, "Train an autoencoder on MNIST or Fashion-MNIST", defaults,
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
      },
      hooks);
}
