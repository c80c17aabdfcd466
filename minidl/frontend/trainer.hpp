// The trainer loop: per-epoch seeded shuffle, one compiled training graph per batch size (the
// last, ragged batch gets its own), evaluation over a whole dataset. With several ranks, every
// rank walks the same permutation and takes its own share of each global batch; the
// data-parallel pass reduces the gradients, and the statistics are summed over ranks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "minidl/frontend/nn.hpp"
#include "minidl/frontend/optim.hpp"
#include "minidl/frontend/trace.hpp"
#include "minidl/io/checkpoint.hpp"
#include "minidl/io/datasets.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/runtime/executable.hpp"

namespace minidl {

struct TrainerOptions {
  std::int64_t batch_size = 64;  // the global batch, split over the ranks
  std::int64_t eval_batch_size = 1000;
  std::uint64_t seed = 1;
  bool shuffle = true;
  runtime::CompileOptions compile;
  // Fold bias_add and relu into matmul / conv2d (ops::FuseBiasActivation) and plain SGD updates
  // into their weight-gradient products (ops::FuseUpdateIntoProduct).
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
  // How the data-parallel pass reduces gradients (with more than one rank).
  parallel::ReduceStrategy reduce_strategy = parallel::ReduceStrategy::Allreduce;
  std::int64_t bucket_bytes = parallel::DataParallelOptions{}.bucket_bytes;  // 0: no buckets
  bool overlap = parallel::DataParallelOptions{}.overlap;  // reduce during the backward
};

struct EpochStats {
  int epoch = 0;
  double loss = 0.0;      // mean over the epoch's samples
  double accuracy = 0.0;  // fraction of the epoch's samples classified right (before each update)
  std::int64_t samples = 0;
  double seconds = 0.0;  // wall time of the training steps, data gathering included
  // The samples trained in this call, which `seconds` covers: fewer than `samples` when the
  // epoch was resumed from a checkpoint taken in its middle.
  std::int64_t timed_samples = 0;
  // With CompileOptions::profile: the part of `seconds` spent in collective kernels (start,
  // blocking reductions, broadcasts) and in waiting for non-blocking ones to finish.
  double comm_seconds = 0.0;
  double wait_seconds = 0.0;
};

struct EvalStats {
  double loss = 0.0;
  double accuracy = 0.0;
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
  Trainer(nn::Module& model, optim::Sgd& optimizer, TrainerOptions options);
  ~Trainer();

  /// One pass over d in the order fixed by (seed, epoch); after resume() to a position inside
  /// this epoch, the rest of that pass. on_step runs after every step on every rank.
  EpochStats train_epoch(const Dataset& d, int epoch, const StepCallback& on_step = {});
  /// Loss and accuracy over all of d; parameters are not changed.
  EvalStats evaluate(const Dataset& d);

  /// This rank's training graph for a full batch of samples of shape `sample`.
  const ir::Graph& training_graph(const Shape& sample);

  /// Kernel time of every training program so far, summed per node name over the programs,
  /// sorted by node name. Empty unless CompileOptions::profile.
  struct KernelTime {
    std::string node, op, kernel;
    std::int64_t calls = 0;
    double seconds = 0.0;
    double flops = 0.0;  // over all calls (0: the op has no count)
  };
  std::vector<KernelTime> kernel_times() const;
  /// Every recorded kernel call of the training programs (CompileOptions::trace), with its
  /// category: communication, wait (for a non-blocking reduction), update or compute.
  std::vector<TraceSpan> trace_spans() const;

  /// The current position (between steps or epochs), its statistics summed over the ranks: a
  /// collective, every rank must call it at the same point.
  TrainerPosition position();
  /// Continues from p (a position() of a run with the same data, batch size, seed and rank
  /// count): the next train_epoch must be for p.epoch and starts at p.next_sample.
  void resume(const TrainerPosition& p);

  /// This rank's share [begin, end) of a global batch of n samples starting at start: an equal
  /// split, or in deterministic mode the micro-shards of its subtree.
  std::pair<std::int64_t, std::int64_t> share(std::int64_t start, std::int64_t n) const;

 private:
  /// share() as rank `rank` sees it.
  std::pair<std::int64_t, std::int64_t> share_of(int rank, std::int64_t start,
                                                 std::int64_t n) const;
  struct Program;
  /// The compiled graph for `local` samples of a global batch of `global` (evaluation: 0).
  Program& program(bool train, std::int64_t local, std::int64_t global, const Shape& sample);
  struct Sums;
  static void gather(const Dataset& d, const std::int64_t* idx, std::int64_t n, Program& p);
  /// Runs p on samples idx[0..n) of d and adds their loss and correct count to sums.
  void step(Program& p, const Dataset& d, const std::int64_t* idx, std::int64_t n, Sums& sums);

  void check_ranks_agree(const Dataset& d, const Shape& sample);
  /// Deterministic mode: micro-shards in a global batch of n samples.
  std::int64_t micro_shards(std::int64_t n) const;

  nn::Module& model_;
  optim::Sgd& optimizer_;
  TrainerOptions options_;
  parallel::Communicator& comm_;
  /// Seconds in communication and waiting kernels of all training programs so far (profiling).
  std::pair<double, double> comm_wait_seconds() const;

  bool preflight_done_ = false;
  std::pair<double, double> comm_wait_ = {0.0, 0.0};  // at the end of the previous epoch
  std::int64_t steps_ = 0;    // training steps since training began: dropout's key step
  TrainerPosition position_;  // the statistics of which are this rank's own
  std::optional<TrainerPosition> resume_;  // where the next train_epoch starts
  std::map<std::tuple<bool, std::int64_t, std::int64_t, std::vector<std::int64_t>>,
           std::unique_ptr<Program>>
      programs_;
};

/// Index of the largest of row's n values (the first on ties).
std::int64_t argmax(const float* row, std::int64_t n);

}  // namespace minidl
