// The command-line training program behind every example: flags (CLI11), data loading, the
// epoch loop with evaluation, per-epoch lines and JSON-lines metrics, saving and graph dumps.
// An example supplies its defaults and a function that builds its model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "minidl/frontend/datasets.hpp"
#include "minidl/frontend/nn.hpp"

namespace minidl {

struct AppConfig {
  std::string data;  // empty: data/<dataset>
  std::string dataset = "mnist";
  std::vector<std::string> datasets{"mnist", "fashion-mnist"};  // allowed values
  std::string hidden = "256,128";
  std::string activation = "relu";
  int epochs = 20;
  std::int64_t batch_size = 64;
  double lr = 0.01;
  double momentum = 0.0;
  std::uint64_t seed = 42;
  int threads = 0;                 // 0: OpenMP's default
  std::string backend = "native";  // preferred kernels: native or onednn (native is the fallback)
  std::int64_t train_limit = 0;
  std::int64_t test_limit = 0;
  std::string metrics;
  std::string save;
  std::string init;
  std::string dump_graph;
  bool no_shuffle = false;

  /// The parsed --hidden list (empty for softmax regression).
  std::vector<std::int64_t> hidden_sizes() const;
};

using ModelBuilder = std::function<std::unique_ptr<nn::Module>(const AppConfig&, const Shape&)>;

/// Parses flags over the defaults in config, trains, and returns the process exit code. Every
/// error (bad flag, missing data, corrupt file) is one line on stderr and a non-zero exit.
int run_training_app(int argc, char** argv, const std::string& description, AppConfig config,
                     const ModelBuilder& build);

}  // namespace minidl
