// CIFAR-10 CNN of report 002: conv 32 filters 3x3 pad 1 -> ReLU -> max-pool 2x2 -> conv 64
// filters 3x3 pad 1 -> ReLU -> max-pool 2x2 -> flatten (64 x 8 x 8 = 4096) -> linear 256 -> ReLU
// -> linear 10 -> softmax cross-entropy; SGD with momentum 0.9, learning rate 0.01, batch 32,
// 10 epochs, inputs standardised per channel with the training set's mean and standard
// deviation. He initialisation for the layers followed by ReLU, Xavier for the output layer.
// The model is fixed: the shared app's --hidden and --activation flags are accepted but unused.
#include "minidl/app/app.hpp"

using namespace minidl;

int main(int argc, char** argv) {
  AppConfig defaults;
  defaults.dataset = "cifar10";
  defaults.datasets = {"cifar10"};
  defaults.normalize = true;
  defaults.epochs = 10;
  defaults.batch_size = 32;
  defaults.lr = 0.01;
  defaults.momentum = 0.9;
  // Measured faster than replicas at 2 threads (median of 3 alternating runs on 3000 samples:
  // 1.08 s vs 1.29 s): the convolutions' GEMMs are large enough to split well.
  defaults.thread_mode = "intra-op";
#if MINIDL_WITH_ONEDNN
  // oneDNN's blocked convolutions and pooling, the activations kept in their layout between
  // them, measured faster (1 epoch of 10000 samples, 2 threads, 2 alternating pairs: 2.57-2.59 s
  // against 3.10-3.68 s native).
  defaults.backend = "onednn";
#endif
  return run_training_app(
      argc, argv, "Train report 002's CNN on CIFAR-10", defaults,
      [](const AppConfig&, const Shape& sample) {
        MINIDL_CHECK(sample.rank() == 3, "cifar_cnn: expected [C,H,W] images, got ", sample);
        const std::int64_t channels = sample[0], h = sample[1], w = sample[2];
        constexpr std::int64_t kPool = 2;
        // Padding 1 keeps each 3x3 convolution's size; the two poolings quarter it.
        const std::int64_t features = 64 * (h / kPool / kPool) * (w / kPool / kPool);  // 4096
        auto model = std::make_unique<nn::Sequential>();
        model->emplace<nn::Conv2d>("conv1", channels, 32, 3, 1, 1, nn::Init::He);
        model->emplace<nn::ReLU>("relu1");
        model->emplace<nn::MaxPool2d>("pool1", kPool);
        model->emplace<nn::Conv2d>("conv2", 32, 64, 3, 1, 1, nn::Init::He);
        model->emplace<nn::ReLU>("relu2");
        model->emplace<nn::MaxPool2d>("pool2", kPool);
        model->emplace<nn::Flatten>("flatten");
        model->emplace<nn::Linear>("fc1", features, 256, nn::Init::He);
        model->emplace<nn::ReLU>("relu3");
        model->emplace<nn::Linear>("fc2", 256, 10, nn::Init::Xavier);
        return model;
      });
}
