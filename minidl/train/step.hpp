// The step compiler: a model, a loss and an optimizer become one compiled training step for a
// Layout. compile_step builds this rank's graph (the forward once per replica of the layout, on
// its slice of the rank's share, the loss weighted by each slice's share of the global batch),
// differentiates it, appends the optimizer's updates, runs the declared pass pipeline and
// compiles it (with gradient accumulation, one program per micro-step size and one that applies
// the summed gradients). A CompiledStep is then fed a batch and run, once per step, by any
// loop: the Trainer's, or a user's own.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/parallel/layout.hpp"
#include "minidl/parallel/zero.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/loss.hpp"
#include "minidl/train/model.hpp"
#include "minidl/train/optimizer.hpp"
#include "minidl/train/pipeline.hpp"

namespace minidl::train {

struct StepOptions {
  parallel::Layout layout{};  // one rank, one replica (so StepOptions{} is a single process)
  parallel::Communicator* comm = nullptr;  // null: parallel::world(); its size is the rank count
  runtime::CompileOptions compile;
  /// Fold bias_add and relu into matmul / conv2d, BatchNorm's input gradient into one pass, and
  /// SGD updates into their weight-gradient products.
  bool fuse = true;
  /// How the data-parallel pass reduces gradients across ranks. Deterministic mode always sums
  /// in the fixed tree: by node (in shared memory first) with Hierarchical, else flat.
  parallel::ReduceStrategy reduce = parallel::ReduceStrategy::Allreduce;
  std::int64_t bucket_bytes = parallel::DataParallelOptions{}.bucket_bytes;
  bool overlap = parallel::DataParallelOptions{}.overlap;
  /// Global-norm gradient clipping after the reduction (0: off).
  double clip_grad_norm = 0.0;
  /// Statistics a model sums across replicas (cross_replica_sum: BatchNorm's) are used summed
  /// over the global batch everywhere, not only for its running statistics (--sync-bn;
  /// parallel::use_global_statistics).
  bool sync_batch_stats = false;
  /// ZeRO over the ranks (parallel/zero.hpp): 1 shards the optimizer state, 2 also the reduced
  /// gradients; 0: every rank updates the whole model. The optimizer's state must then be
  /// initialised for this rank's pieces (zero_state_shapes).
  int zero = 0;
  /// Tensor parallelism (parallel/tensor_parallel.hpp, train/tensor_parallel.hpp): the shards
  /// of this rank's replica, over which training graphs split the model's Linear pairs, whose
  /// parameters the model must store as this rank's parts (train::shard_split_parameters);
  /// `comm` is then the replicas of this rank's shard. Null: none.
  parallel::Communicator* tensor_comm = nullptr;
  /// Pipeline stages (train/pipeline.hpp): with stages > 1 the training program holds this
  /// rank's stage only, the layout's replicas (or micro-shards) are the micro-batches, and the
  /// communicator above is the stage's own (its data-parallel replicas).
  PipelineOptions pipeline;
};

/// The flat space of model's parameters (in its order) cut into one shard per rank.
parallel::ZeroPlan zero_plan(Model& model, int ranks);
/// The pieces of the parameters that `rank` owns under plan, named after their parameters: what
/// Optimizer::init_state takes with ZeRO.
std::vector<std::pair<std::string, Shape>> zero_state_shapes(const parallel::ZeroPlan& plan,
                                                             int rank);

/// What one compiled step computes: training steps on global batches of `batch` samples, or
/// evaluation of `batch` samples on this rank (train false: no gradients, no updates, no
/// layout: evaluation is sharded by the caller).
struct StepSpec {
  Shape sample;  // one sample's shape, e.g. [1, 28, 28]
  /// Training: the global batch, the samples of one optimizer step (all its micro-steps);
  /// evaluation: this rank's samples.
  std::int64_t batch = 0;
  bool train = true;
  /// Build the programs as rank `as_rank` runs them (-1: this rank). Ranks may own different
  /// shares in deterministic mode; the preflight compares rank 0's programs on every rank.
  int as_rank = -1;
};

/// The per-step inputs the loop supplies.
struct StepFeed {
  double lr = 0.0;        // this step's learning rate (schedule)
  std::int64_t step = 0;  // optimizer steps done before this one (AdamW counts from it; with the
                          // sample's place in the batch, it keys dropout's masks)
};

/// The bytes one rank's training step holds, by what they hold (MINIDL_VERBOSE=memory, the
/// metrics' config record).
struct MemoryUse {
  /// The parameters the step binds: whole, or with tensor parallelism this rank's parts of the
  /// split ones.
  std::int64_t parameters = 0;
  /// The reduced gradients: the values the gradients' reduction hands the updates (the whole
  /// model's, or with --zero 2 this rank's shard).
  std::int64_t gradients = 0;
  std::int64_t optimizer_state = 0;  // the state the updates read and write
  /// The executables' planned buffers after reuse: activations, the backward's gradients
  /// before their reduction, temporaries.
  std::int64_t activations = 0;
};

/// One optimizer step, compiled. Without gradient accumulation one program runs the forward,
/// backward, gradient reduction and update of this rank's share of the batch. With it (the
/// layout's micro_steps), a program per micro-step size runs the forward and backward of one
/// micro-step; its gradients are summed outside the graph in the layout's order (in
/// deterministic mode joined across ranks in the tree after each micro-step), and an apply
/// program reduces (other modes), clips and applies the sum.
class CompiledStep {
 public:
  /// One replica's inputs: samples [begin, end) of this rank's share of a micro-step, to be
  /// written into x and target before it runs.
  struct Part {
    std::int64_t begin = 0, end = 0;
    Tensor x, target;
    ir::Value* predictions = nullptr;
  };
  /// Micro-steps per run (1 without accumulation, and for evaluation).
  std::size_t micro_steps() const { return micro_.size(); }
  /// This rank's samples of micro-step j, relative to the batch's start.
  parallel::Slice share(std::size_t j = 0) const;
  /// Micro-step j's inputs (shared by the micro-steps of the same size: fill them right before
  /// the micro-step runs).
  std::span<Part> parts(std::size_t j = 0);
  std::span<const Part> parts(std::size_t j = 0) const;
  /// The loss's target for parts(0)[0], the first part of the first micro-step (other parts'
  /// targets differ only in their number of samples).
  const TargetSpec& target() const { return target_; }
  bool classification() const { return classification_; }

  /// Runs one step (training) or one evaluation whose single micro-step's inputs are written.
  /// Throws if the loss is not finite.
  void run(const StepFeed& feed = {});
  /// Runs one step of micro_steps() micro-steps: fill(j) writes micro-step j's samples into
  /// parts(j) right before it runs.
  void run(const StepFeed& feed, const std::function<void(std::size_t)>& fill);
  /// After run(): the loss summed over this rank's samples (the mean times the samples).
  double loss_sum() const { return loss_sum_; }
  /// After run(), classification only: this rank's samples whose largest probability is at
  /// their label.
  std::int64_t correct() const;
  /// After run() with clipping: the global gradient norm before clipping (the same on every
  /// rank); nullopt without clipping.
  std::optional<double> grad_norm() const;

  /// What this rank's programs hold, by kind.
  MemoryUse memory() const;

  /// The first micro-step's graph (the whole step's without accumulation).
  const ir::Graph& graph() const { return *programs_.front().graph; }
  /// Every program's graph and executable: the micro-steps' and the apply program's.
  std::vector<const ir::Graph*> graphs() const;
  std::vector<const runtime::Executable*> executables() const;

 private:
  friend CompiledStep compile_step(Model&, const Loss&, optim::Optimizer*, const StepSpec&,
                                   const StepOptions&);
  struct Program {
    std::unique_ptr<ir::Graph> graph;
    std::unique_ptr<runtime::Executable> exe;
    parallel::Slice share;  // this rank's samples, relative to its micro-step's start
    std::vector<Part> parts;
    ir::Value* loss = nullptr;
    double loss_to_sum = 0.0;
    std::vector<ir::Value*> grads;  // a micro-step's gradients, in the apply program's order
    std::unique_ptr<parallel::TreeAllreduce> tree;  // deterministic: joins them across ranks
    Tensor lr, step, rng_key;
  };
  struct Micro {
    parallel::Slice samples;  // relative to the batch's start
    std::size_t program = 0;
  };
  void add_apply_program(Model& model, optim::Optimizer& optimizer,
                         const std::vector<std::string>& param_names, const StepOptions& o,
                         parallel::Communicator& comm, int rank);
  void run_micro(std::size_t j, const StepFeed& feed);
  void push_gradients(std::size_t j);

  std::vector<Program> programs_;
  std::vector<Micro> micro_;
  std::unique_ptr<Program> apply_;  // with accumulation
  std::vector<Tensor> apply_grads_;
  std::vector<std::int64_t> offsets_;  // of each gradient in a flat sum, and the total last
  std::vector<int> joins_;
  std::vector<std::vector<float>> stack_;  // partial sums of the micro-steps' gradients
  std::size_t depth_ = 0;
  TargetSpec target_;
  bool classification_ = false;
  const runtime::Executable* norm_exe_ = nullptr;
  ir::Value* norm_ = nullptr;
  double loss_sum_ = 0.0;
  std::int64_t correct_ = 0;
  bool check_numerics_ = false;
  std::vector<std::vector<PipelineAction>> schedule_;  // with pipeline stages

 public:
  /// With pipeline stages: every stage's actions (this rank's is its stage's).
  const std::vector<std::vector<PipelineAction>>& pipeline_schedule() const { return schedule_; }
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
