// A small BatchNorm CNN for CIFAR-10: the convolutions of report 002's CNN, each followed by
// BatchNorm, and a global-average-pooling head in place of its 4096 -> 256 -> 10 classifier:
//
//   conv 3x3, 32, pad 1 -> BN -> ReLU -> max-pool 2x2       (32x32 -> 16x16)
//   conv 3x3, 64, pad 1 -> BN -> ReLU -> max-pool 2x2       (16x16 -> 8x8)
//   global average pooling -> flatten -> linear 64 -> 10 -> softmax cross-entropy
//
// 20 138 parameters (the convolutions have no bias, as BN follows each), trained with
// cifar_cnn's recipe: SGD with momentum 0.9, learning rate 0.01, batch 32, 10 epochs, inputs
// standardised per channel. He normal initialisation for the convolutions, BN weight 1 and bias
// 0, Xavier uniform for fc with a zero bias; parameter names conv1, bn1, conv2, bn2, fc, as in
// bench/pytorch_reference.py's twin.
//
// Besides a model to start from, it is the BatchNorm CNN on which float32 runs of minidl and of
// PyTorch agree to float32 rounding after ten matched steps, BatchNorm's running statistics
// included (bench/compare-pytorch requires 3e-6 of each tensor's largest magnitude): on this
// model PyTorch's own float32 and float64 runs stay within 5e-7 of each other over those steps,
// where on ResNet-20 they drift up to 5e-4 apart, so a difference in what the two frameworks
// compute shows above the rounding. The model is fixed: the shared app's --hidden and
// --activation flags are accepted but unused.
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
  defaults.thread_mode = "intra-op";  // each BatchNorm normalises the whole batch
#if MINIDL_WITH_ONEDNN
  defaults.backend = "onednn";
#endif
  return run_training_app(
      argc, argv, "Train a small BatchNorm CNN on CIFAR-10", defaults,
      [](const AppConfig&, const Shape& sample) {
        MINIDL_CHECK(sample.rank() == 3, "cifar_bn_cnn: expected [C,H,W] images, got ", sample);
        constexpr std::int64_t kPool = 2, kClasses = 10;
        auto model = std::make_unique<nn::Sequential>();
        model->emplace<nn::Conv2d>("conv1", sample[0], 32, 3, 1, 1, nn::Init::He, false);
        model->emplace<nn::BatchNorm2d>("bn1", 32);
        model->emplace<nn::ReLU>("relu1");
        model->emplace<nn::MaxPool2d>("pool1", kPool);
        model->emplace<nn::Conv2d>("conv2", 32, 64, 3, 1, 1, nn::Init::He, false);
        model->emplace<nn::BatchNorm2d>("bn2", 64);
        model->emplace<nn::ReLU>("relu2");
        model->emplace<nn::MaxPool2d>("pool2", kPool);
        model->emplace<nn::AdaptiveAvgPool2d>("pool", 1);
        model->emplace<nn::Flatten>("flatten");
        model->emplace<nn::Linear>("fc", 64, kClasses, nn::Init::Xavier);
        return model;
      });
}
