// The step compiler: a model, a loss and an optimizer become one compiled training step for a
// Layout. compile_step builds this rank's graph (the forward once per replica of the layout, on
// its slice of the rank's share, the loss weighted by each slice's share of the global batch),
// differentiates it, appends the optimizer's updates, runs the declared pass pipeline and
// compiles it. A CompiledStep is then fed a batch and run, once per step, by any loop: the
// Trainer's, or a user's own.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/parallel/layout.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/loss.hpp"
#include "minidl/train/model.hpp"
#include "minidl/train/optimizer.hpp"

namespace minidl::train {

struct StepOptions {
  parallel::Layout layout{};  // one rank, one replica (so StepOptions{} is a single process)
  parallel::Communicator* comm = nullptr;  // null: parallel::world(); its size is the rank count
  runtime::CompileOptions compile;
  /// Fold bias_add and relu into matmul / conv2d, and plain SGD updates into their
  /// weight-gradient products.
  bool fuse = true;
  /// How the data-parallel pass reduces gradients across ranks (not in deterministic mode,
  /// which always sums in the fixed tree).
  parallel::ReduceStrategy reduce = parallel::ReduceStrategy::Allreduce;
  std::int64_t bucket_bytes = parallel::DataParallelOptions{}.bucket_bytes;
  bool overlap = parallel::DataParallelOptions{}.overlap;
  /// Global-norm gradient clipping after the reduction (0: off).
  double clip_grad_norm = 0.0;
};

/// What one compiled program computes: training steps on global batches of `batch` samples, or
/// evaluation of `batch` samples on this rank (train false: no gradients, no updates, no
/// layout: evaluation is sharded by the caller).
struct StepSpec {
  Shape sample;            // one sample's shape, e.g. [1, 28, 28]
  std::int64_t batch = 0;  // training: the global batch; evaluation: this rank's samples
  bool train = true;
  /// Build the program as rank `as_rank` runs it (-1: this rank). Ranks may own different
  /// shares in deterministic mode; the preflight compares rank 0's program on every rank.
  int as_rank = -1;
};

/// The per-step inputs the loop supplies.
struct StepFeed {
  double lr = 0.0;                // this step's learning rate (schedule)
  std::int64_t step = 0;          // optimizer steps done before this one (AdamW counts from it)
  std::int64_t first_sample = 0;  // global index of this rank's first sample (dropout's key)
};

class CompiledStep {
 public:
  /// One replica's inputs: samples [begin, end) of this rank's share, to be written into x and
  /// target before run().
  struct Part {
    std::int64_t begin = 0, end = 0;
    Tensor x, target;
    ir::Value* predictions = nullptr;
  };
  /// This rank's share of the global batch, relative to the batch's start.
  parallel::Slice share() const { return share_; }
  std::span<Part> parts() { return parts_; }
  /// The loss's target for this program's parts (shape of one part's target differs by size).
  const TargetSpec& target() const { return target_; }
  bool classification() const { return classification_; }

  /// Runs one step (training) or one evaluation. Throws if the loss is not finite.
  void run(const StepFeed& feed = {});
  /// After run(): the loss summed over this rank's samples (the mean times the samples).
  double loss_sum() const;
  /// After run(), classification only: this rank's samples whose largest probability is at
  /// their label.
  std::int64_t correct() const;
  /// After run() with clipping: the global gradient norm before clipping (the same on every
  /// rank); nullopt without clipping.
  std::optional<double> grad_norm() const;

  const ir::Graph& graph() const { return *graph_; }
  const runtime::Executable& executable() const { return *exe_; }

 private:
  friend CompiledStep compile_step(Model&, const Loss&, optim::Optimizer*, const StepSpec&,
                                   const StepOptions&);
  std::unique_ptr<ir::Graph> graph_;
  std::unique_ptr<runtime::Executable> exe_;
  parallel::Slice share_;
  std::vector<Part> parts_;
  TargetSpec target_;
  bool classification_ = false;
  ir::Value* loss_ = nullptr;
  double loss_to_sum_ = 0.0;
  ir::Value* norm_ = nullptr;
  Tensor lr_, step_, rng_key_;
  bool check_numerics_ = false;
};

/// Compiles this rank's program. Training needs an optimizer; evaluation takes none. A
/// collective for training with several ranks (the data-parallel pass splits the communicator
/// once): every rank compiles the same specs in the same order. Errors name the program
/// ("compiling the training graph for 32 of 64 samples: ...").
CompiledStep compile_step(Model& model, const Loss& loss, optim::Optimizer* optimizer,
                          const StepSpec& spec, const StepOptions& options);

/// Index of the largest of row's n values (the first on ties).
std::int64_t argmax(const float* row, std::int64_t n);

}  // namespace minidl::train
