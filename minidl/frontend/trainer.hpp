// The trainer loop: per-epoch seeded shuffle, one compiled step per batch size (the last, ragged
// batch gets its own; train::compile_step builds them, the Trainer builds no graph), evaluation
// over a whole dataset, statistics, the learning-rate schedule and the position checkpoints
// record. With several ranks, every rank walks the same permutation and feeds its own share of
// each global batch (the Layout says which); the statistics are summed over ranks. Each training
// batch is prepared (gathered, augmented) on a prefetch thread while the step before it runs.
#pragma once

#include <array>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "minidl/frontend/trace.hpp"
#include "minidl/io/checkpoint.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/batch.hpp"
#include "minidl/train/schedule.hpp"
#include "minidl/train/step.hpp"

namespace minidl {

struct TrainerOptions {
  std::int64_t batch_size = 64;  // the global batch of one micro-step, split over the ranks
  /// Gradient accumulation: micro-steps of batch_size samples per optimizer step, whose
  /// gradients are summed before one update on accumulate * batch_size samples.
  std::int64_t accumulate = 1;
  std::int64_t eval_batch_size = 1000;
  std::uint64_t seed = 1;
  bool shuffle = true;
  runtime::CompileOptions compile;
  // Fold bias_add and relu into matmul / conv2d and relu into BatchNorm and residual sums
  // (ops::FuseBiasActivation), BatchNorm's input gradient into one pass
  // (ops::FuseBatchNormBackward), relu_bwd's mask into the BatchNorm backward
  // (ops::FuseActivationBackward) and SGD updates into their weight-gradient products
  // (ops::FuseUpdateIntoProduct).
  bool fuse = true;
  // Data-parallel thread replicas per rank for training (parallel::ThreadReplicas): each runs
  // the forward and backward of its slice of the rank's batch on its own OpenMP thread. 1: one
  // graph whose kernels use the OpenMP threads inside each op (intra-op).
  int replicas = 1;
  // Deterministic training when > 0: every global batch is cut into micro-shards of this many
  // samples (the last one of a ragged batch may be smaller), each computed as a replica of its
  // own whoever runs it, on one thread, and their gradients summed in the fixed tree of
  // parallel/reduction_tree.hpp across threads and ranks (each owning a subtree). The
  // parameters then have the same bits for any split into ranks x threads; `replicas`,
  // `reduce_strategy` and `overlap` do not apply.
  std::int64_t micro_batch = 0;
  parallel::Communicator* comm = nullptr;  // null: parallel::world()
  /// Tensor parallelism (train::StepOptions::tensor_comm): the shards of this rank's replica;
  /// `comm` is then the replicas of this rank's shard. Null: none.
  parallel::Communicator* tensor_comm = nullptr;
  // How the data-parallel pass reduces gradients (with more than one rank).
  parallel::ReduceStrategy reduce_strategy = parallel::ReduceStrategy::Allreduce;
  std::int64_t bucket_bytes = parallel::DataParallelOptions{}.bucket_bytes;  // 0: no buckets
  bool overlap = parallel::DataParallelOptions{}.overlap;  // reduce during the backward
  /// Global-norm gradient clipping after the reduction (0: off).
  double clip_grad_norm = 0.0;
  /// Batch statistics summed over the global batch (train::StepOptions::sync_batch_stats).
  bool sync_batch_stats = false;
  /// ZeRO (train::StepOptions::zero): 1 shards the optimizer state over the ranks, 2 also the
  /// reduced gradients; 0: off. Not with accumulation, another reduce strategy or overlap.
  int zero = 0;
  /// Pipeline stages (train::PipelineOptions), one rank each; 1: none. The layout's replicas
  /// (deterministic: micro-shards) are the micro-batches.
  int pipeline_stages = 1;
  std::string pipeline_schedule = "gpipe";  // gpipe or 1f1b
  /// Where the stages end (train::PipelineOptions::boundaries); empty: cut automatically.
  std::vector<std::string> pipeline_boundaries;
  /// What the automatic cut balances (train::PipelineOptions::balance): time, flops or params.
  std::string pipeline_balance = "time";
  /// The loss; null: softmax cross-entropy against the labels.
  const train::Loss* loss = nullptr;
  /// What the loss's targets are: the dataset's labels, or the samples themselves (an
  /// autoencoder's reconstruction target, flattened to the output's shape).
  enum class Targets { Labels, Inputs };
  Targets targets = Targets::Labels;
  /// The learning rate of every step; null: the optimizer's own, constant.
  const optim::LrSchedule* schedule = nullptr;
  /// Random transforms of the training images (never of evaluation's), each sample's drawn
  /// from (seed, epoch, its index in the data set): the same on any layout, and on --resume.
  train::Augment augment;
  /// Prepare each training batch (this rank's share gathered, augmented) on a thread of its own
  /// while the step before it runs, into a staging buffer the step then copies from; off: on
  /// the main thread, into the step's inputs, right before each micro-step. The same bits
  /// either way.
  bool prefetch = true;
  /// Testing: preparing the batch of training step G (counted from the start of training)
  /// throws, as a broken batch would; 0: never.
  std::int64_t fail_preparing_step = 0;
};

struct EpochStats {
  int epoch = 0;
  double loss = 0.0;      // mean over the epoch's samples
  double accuracy = 0.0;  // fraction of the epoch's samples classified right (before each update);
                          // NaN when the loss does not classify
  std::int64_t samples = 0;
  double seconds = 0.0;  // wall time of the training steps, data gathering included
  // The samples trained in this call, which `seconds` covers: fewer than `samples` when the
  // epoch was resumed from a checkpoint taken in its middle.
  std::int64_t timed_samples = 0;
  // With CompileOptions::profile: the part of `seconds` spent in collective kernels (start,
  // blocking reductions, broadcasts) and in waiting for non-blocking ones to finish.
  double comm_seconds = 0.0;
  double wait_seconds = 0.0;
  // Data, part of `seconds`: the time the main thread spent getting its batches (waiting for the
  // prefetch thread and copying from its buffer; without prefetch, gathering and augmenting),
  // and the time spent preparing them (gathering and augmenting, on whichever thread did it).
  // With prefetch, a data_wait_seconds well below data_prepare_seconds means the preparation
  // was hidden behind the steps.
  double data_wait_seconds = 0.0;
  double data_prepare_seconds = 0.0;
  // The floating-point operations of the epoch's training steps on all ranks, as the ops count
  // them (runtime::Executable::flops_per_run: the products and the convolutions, forward and
  // backward; work a layout repeats, such as the layers tensor parallelism leaves whole on every
  // shard, counts on each rank): flops / seconds is the rate the model trained at,
  // flops / timed_samples its training FLOPs per sample.
  double flops = 0.0;
  double lr = 0.0;  // the learning rate of the epoch's last step
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // mean over the epoch's steps,
                                                                // with clipping; else NaN
};

struct EvalStats {
  double loss = 0.0;
  double accuracy = 0.0;  // NaN when the loss does not classify
  std::int64_t samples = 0;
};

/// Where training stands between two steps; the checkpoint format stores it.
using TrainerPosition = checkpoint::Position;

/// What the trainer tells every rank after each training step.
struct StepInfo {
  int epoch = 0;
  std::int64_t epoch_step = 0;  // steps done in this epoch, this one included
  std::int64_t position = 0;    // samples of the epoch's order done, over all ranks
  std::int64_t epoch_size = 0;  // samples in the epoch
  std::int64_t step = 0;        // training steps done since training began
  // Mean loss over this rank's samples of the epoch trained in this call so far: read back
  // every step anyway, so reporting it costs nothing.
  double running_loss = 0.0;
};
using StepCallback = std::function<void(const StepInfo&)>;

class Trainer {
 public:
  Trainer(train::Model& model, optim::Optimizer& optimizer, TrainerOptions options);
  ~Trainer();

  /// One pass over d in the order fixed by (seed, epoch); after resume() to a position inside
  /// this epoch, the rest of that pass. on_step runs after every step on every rank.
  EpochStats train_epoch(const Dataset& d, int epoch, const StepCallback& on_step = {});
  /// Loss and accuracy over all of d; parameters are not changed.
  EvalStats evaluate(const Dataset& d);

  /// This rank's training graph for a full batch of samples of shape `sample` (with
  /// accumulation, its first micro-step's).
  const ir::Graph& training_graph(const Shape& sample);

  /// Kernel time of every training program so far, summed per node name over the programs,
  /// sorted by node name. Empty unless CompileOptions::profile.
  struct KernelTime {
    std::string node, op, kernel;
    std::string category;  // compute, update, communication or wait
    std::int64_t calls = 0;
    double seconds = 0.0;
    /// Of calls and seconds: the first call of each program (runtime::KernelProfile::
    /// first_seconds), which --profile leaves out of its table.
    std::int64_t first_calls = 0;
    double first_seconds = 0.0;
    double flops = 0.0;     // over all calls (0: the op has no count)
    double elements = 0.0;  // per call (runtime::node_elements), the mean over the calls
  };
  std::vector<KernelTime> kernel_times() const;
  /// Every recorded kernel call of the training programs (CompileOptions::trace), with its
  /// category: communication, wait (for a non-blocking reduction), update or compute; a
  /// receive's wait for its message is a span of its own ("bubble", category idle).
  std::vector<TraceSpan> trace_spans() const;
  /// The executables of every training program this rank runs (not those compiled as another
  /// rank for the preflight): their profiles say where the steps' time went.
  std::vector<const runtime::Executable*> training_executables() const;

  /// Ends the epoch in progress after the current step (from a StepCallback); train_epoch then
  /// returns that epoch's statistics so far. Every rank must ask at the same step.
  void request_stop() { stop_ = true; }

  /// The current position (between steps or epochs), its statistics summed over the ranks: a
  /// collective, every rank must call it at the same point.
  TrainerPosition position();
  /// Continues from p (a position() of a run with the same data, batch size, seed and rank
  /// count): the next train_epoch must be for p.epoch and starts at p.next_sample.
  void resume(const TrainerPosition& p);

  /// Training steps in an epoch of `samples`: every batch (of batch_size * accumulate) but a
  /// last one smaller than the rank count, which every rank skips.
  static std::int64_t steps_per_epoch(std::int64_t samples, std::int64_t batch, int ranks);

  /// The optimizer's state as a checkpoint holds it: whole tensors, "<param>.<kind>". Without
  /// ZeRO the optimizer's own tensors (copying into them sets the state); with it a collective
  /// that gathers the ranks' pieces into new tensors.
  NamedTensors optimizer_state();
  /// Sets the state from whole tensors as optimizer_state() returns them (with ZeRO, each rank
  /// keeps its pieces; without, nothing to do when they are the optimizer's own).
  void set_optimizer_state(const NamedTensors& state);

  /// With pipeline stages: every rank takes the parameters and optimizer state of every other
  /// stage from the rank that updates them (a collective), so that evaluation, checkpoints and
  /// --save see the whole model. train_epoch calls it at the end of an epoch.
  void gather_stages();

  /// What this rank's training step for a full batch of `sample`s holds, by kind (compiles it
  /// when not yet compiled: every rank calls it at the same point).
  train::MemoryUse memory(const Shape& sample);

  /// The preflight of the training graphs (a collective; once, later calls return): compiles
  /// the step for d and compares the data size, batch, seed, shuffling, layout and the graphs'
  /// fingerprints across the ranks; throws parallel::PreflightError on every rank when they
  /// differ. train_epoch runs it when it has not run.
  void check_ranks_agree(const Dataset& d);

  /// The layout every training step is compiled for.
  const parallel::Layout& layout() const { return step_options_.layout; }
  const train::Loss& loss() const { return *loss_; }

 private:
  /// The compiled step for a global batch of n samples (train), or for n samples of this
  /// rank's evaluation shard.
  train::CompiledStep& program(bool train, std::int64_t n, const Shape& sample, int as_rank = -1);
  struct Sums;
  /// Samples per optimizer step: batch_size times accumulate.
  std::int64_t step_batch() const { return options_.batch_size * options_.accumulate; }
  /// Runs p, fill(j) writing micro-step j's samples, and adds the loss and correct count of
  /// this rank's samples to sums.
  void step(train::CompiledStep& p, const std::function<void(std::size_t)>& fill,
            const train::StepFeed& feed, Sums& sums);

  train::Model& model_;
  optim::Optimizer& optimizer_;
  TrainerOptions options_;
  parallel::Communicator& comm_;
  train::StepOptions step_options_;
  // With pipeline stages: the communicator of this rank's stage (its data-parallel replicas).
  std::unique_ptr<parallel::Communicator> stage_comm_;
  std::unique_ptr<train::Loss> own_loss_;  // the default loss, when options.loss is null
  const train::Loss* loss_ = nullptr;
  /// Seconds in communication and waiting kernels of all training programs so far (profiling).
  std::pair<double, double> comm_wait_seconds() const;
  /// The floating-point operations of this rank's training steps so far.
  double training_flops() const;

  // The batches the prefetch thread prepares, in turn: kept, so that their buffers serve every
  // epoch.
  std::array<train::StagedBatch, 2> staged_;
  bool preflight_done_ = false;
  bool stop_ = false;
  std::pair<double, double> comm_wait_ = {0.0, 0.0};  // at the end of the previous epoch
  double flops_ = 0.0;                                // training_flops() then
  std::int64_t steps_ = 0;    // training steps since training began: dropout's key step
  TrainerPosition position_;  // the statistics of which are this rank's own
  std::optional<TrainerPosition> resume_;  // where the next train_epoch starts
  std::map<std::tuple<bool, std::int64_t, std::vector<std::int64_t>, int>,
           std::unique_ptr<train::CompiledStep>>
      programs_;
};

using train::argmax;

}  // namespace minidl
