// The trainer loop: per-epoch seeded shuffle, one compiled training graph per batch size (the
// last, ragged batch gets its own), evaluation over a whole dataset.
#pragma once

#include <map>
#include <memory>

#include "minidl/frontend/datasets.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/frontend/optim.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl {

struct TrainerOptions {
  std::int64_t batch_size = 64;
  std::int64_t eval_batch_size = 1000;
  std::uint64_t seed = 1;
  bool shuffle = true;
  runtime::CompileOptions compile;
};

struct EpochStats {
  int epoch = 0;
  double loss = 0.0;      // mean over the epoch's samples
  double accuracy = 0.0;  // fraction of the epoch's samples classified right (before each update)
  std::int64_t samples = 0;
  double seconds = 0.0;   // wall time of the training steps, data gathering included
};

struct EvalStats {
  double loss = 0.0;
  double accuracy = 0.0;
  std::int64_t samples = 0;
};

class Trainer {
 public:
  Trainer(nn::Module& model, optim::Sgd& optimizer, TrainerOptions options);
  ~Trainer();

  /// One pass over d in the order fixed by (seed, epoch).
  EpochStats train_epoch(const Dataset& d, int epoch);
  /// Loss and accuracy over all of d; parameters are not changed.
  EvalStats evaluate(const Dataset& d);

  /// The training graph for a batch of sample shape `sample` (built on first use).
  const ir::Graph& training_graph(const Shape& sample);

 private:
  struct Program;
  Program& program(bool train, std::int64_t batch, const Shape& sample);
  static void gather(const Dataset& d, const std::int64_t* idx, std::int64_t n, Program& p);

  nn::Module& model_;
  optim::Sgd& optimizer_;
  TrainerOptions options_;
  std::map<std::tuple<bool, std::int64_t, std::vector<std::int64_t>>, std::unique_ptr<Program>>
      programs_;
};

/// Index of the largest of row's n values (the first on ties).
std::int64_t argmax(const float* row, std::int64_t n);

}  // namespace minidl
