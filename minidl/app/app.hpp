// The command-line training program behind every example: flags (CLI11), data loading, the
// epoch loop with evaluation, per-epoch lines and JSON-lines metrics, saving and graph dumps.
// An example supplies its defaults and a function that builds its model.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "minidl/frontend/nn.hpp"
#include "minidl/io/datasets.hpp"

namespace minidl {

struct AppConfig {
  std::string data;               // empty: data/<dataset>
  std::string dataset = "mnist";  // the default; one of datasets
  // The datasets the example accepts for --dataset, each a name load_dataset knows.
  std::vector<std::string> datasets{"mnist", "fashion-mnist"};
  // Standardise every channel with the training set's mean and standard deviation (applied to
  // the test set too); otherwise pixels stay in [0,1].
  bool normalize = false;
  std::string hidden = "256,128";
  std::string activation = "relu";
  int epochs = 20;
  std::int64_t batch_size = 64;
  std::int64_t accumulate = 1;  // micro-steps per optimizer step (TrainerOptions::accumulate)
  double lr = 0.01;
  double momentum = 0.0;
  std::string optimizer = "sgd";  // sgd or adamw
  bool nesterov = false;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  std::string lr_schedule = "constant";           // constant, step or cosine
  std::int64_t lr_step_epochs = 1;
  double lr_gamma = 0.1;
  std::int64_t warmup_steps = 0;
  double clip_grad_norm = 0.0;  // 0: off
  // The loss, and the ones --loss accepts (the model decides which make sense).
  std::string loss = "cross-entropy";
  std::vector<std::string> losses{"cross-entropy"};
  double label_smoothing = 0.0;  // cross-entropy only
  // What the loss scores the output against: the labels, or the input images themselves
  // (an autoencoder).
  bool reconstruct = false;
  std::int64_t max_steps = 0;  // stop after this many training steps (0: all epochs)
  std::uint64_t seed = 42;
  int threads = 0;                 // 0: OpenMP's default
  std::string backend = "native";  // preferred kernels: native or onednn (native is the fallback)
  std::string precision = "f32";   // the convolutions' and products' arithmetic: f32 or bf16
  // Subnormal numbers: "flush" (flush-to-zero and denormals-are-zero on every thread) or "keep".
  std::string denormals = "flush";
  // How a rank uses its --threads: "replicas" (one data-parallel replica of the forward and
  // backward per thread) or "intra-op" (one graph, kernels parallel inside). Each example sets
  // the one measured faster for its model.
  std::string thread_mode = "intra-op";
  std::string reduce =
      "allreduce";          // gradient reduction across ranks: allreduce, root, hierarchical
  double bucket_mb = 0.25;  // gradient bucket size; 0: one collective per gradient
  bool sync_bn = false;     // BatchNorm statistics over the global batch (SyncBatchNorm)
  bool overlap = false;     // non-blocking reductions started during the backward (default off:
                            // measured no faster on a 2-core machine, see DataParallelOptions)
  // Deterministic training (TrainerOptions::micro_batch): the same parameter bits for any
  // ranks x threads, with micro-shards of micro_batch samples.
  bool deterministic = false;
  std::int64_t micro_batch = 8;
  int pipeline_stages = 1;  // pipeline stages, one rank each (TrainerOptions::pipeline_stages)
  std::int64_t micro_batches = 0;  // micro-batches per batch with pipeline stages (0: 1 per stage)
  std::string schedule = "gpipe";  // pipeline schedule: gpipe or 1f1b
  std::string dump_schedule;       // file for every stage's actions
  // Where the pipeline stages end: names of the model's children (or nodes), comma-separated;
  // empty: cut automatically.
  std::string stage_boundaries;
  std::string stage_balance = "time";  // what the automatic pipeline cut balances
  int zero = 0;  // ZeRO stage (TrainerOptions::zero): 1 optimizer state sharded, 2 gradients too
  // Tensor-parallel shards per replica (TrainerOptions::tensor_comm): the ranks are replicas x
  // shards, and the model's Linear pairs are split over the shards.
  int tensor_parallel = 1;
  bool no_fuse = false;      // keep bias_add and relu as separate nodes
  std::int64_t upscale = 1;  // images enlarged k times per side (granularity studies)
  // Random transforms of the training images (train::Augment::parse): none, crop, flip or
  // crop,flip. Off by default; cifar_resnet turns crop,flip on.
  std::string augment = "none";
  bool no_prefetch = false;     // prepare each training batch on the main thread, before its step
  bool profile = false;         // per-kernel timing: the epoch split and a kernel table
  bool check_numerics = false;  // scan every node's output for NaN and Inf
  double collective_timeout =
      0.0;  // seconds a collective may wait for the other ranks (0: no limit)
  std::int64_t train_limit = 0;
  std::int64_t test_limit = 0;
  std::string metrics;
  std::string save;
  std::string init;
  std::string dump_graph;
  std::string trace;  // Chrome trace of every kernel call of the job (rank 0 writes it)
  // A simulated run (SimGrid SMPI) only: per-node compute times (JSON, scripts/simulate-cluster
  // writes it) spent instead of running the kernels (minidl/app/simulated.hpp).
  std::string compute_table;
  bool no_shuffle = false;
  // --quiet: nothing on stdout but one final line (test loss and accuracy after the last
  // epoch); errors still go to stderr. No header, per-epoch lines, bar, notes or profile.
  bool quiet = false;
  // Checkpoints (checkpoint.hpp): written by rank 0 to checkpoint_dir every checkpoint_every
  // epochs and/or every checkpoint_every_steps training steps (a directory alone: every
  // epoch), keeping the newest checkpoint_keep. resume: a checkpoint file, or a directory
  // meaning its newest checkpoint, to continue from.
  std::string checkpoint_dir;
  int checkpoint_every = 0;
  std::int64_t checkpoint_every_steps = 0;
  int checkpoint_keep = 3;
  std::string resume;

  /// The parsed --hidden list (empty for softmax regression).
  std::vector<std::int64_t> hidden_sizes() const;
  /// Whether training batches are prepared on a thread of their own: unless --no-prefetch, or
  /// no CPU is left for that thread (the OpenMP threads of this process, and of the node's other
  /// ranks when it is not bound to cores of its own, use every CPU it may run on: a rank bound
  /// to one core, --threads 2 on 2 cores), where the thread would only take turns with the
  /// step's threads and delay its collectives. Call after the thread count is set.
  bool prefetch() const;
  /// Why batches are prepared on the main thread ("--no-prefetch", or that no CPU is left), or
  /// "" when a prefetch thread prepares them.
  std::string prefetch_off() const;
};

using ModelBuilder = std::function<std::unique_ptr<nn::Module>(const AppConfig&, const Shape&)>;

/// A string-valued flag of the example's own ("--png FILE"), parsed with the app's flags and
/// listed by --help; *value's content before parsing is its default.
struct AppFlag {
  std::string name;  // "--png"
  std::string help;
  std::string* value = nullptr;
  /// Optional: "" when the value is good, else what is wrong with it (the app reports it as a
  /// bad flag, before any data is read).
  std::function<std::string(const std::string&)> check;
};

/// What an example adds to the app besides its defaults and its model.
struct AppHooks {
  std::vector<AppFlag> flags;
  /// Runs on rank 0 at the very end (after the last evaluation and --save) with the trained
  /// model and the test set as it was evaluated (limited, upscaled, normalised); an
  /// minidl::Error it throws ends the program like any other.
  std::function<void(const AppConfig&, nn::Module& model, const Dataset& test_set)> after_training;
};

/// Parses flags over the defaults in config (and the example's own, hooks.flags), trains, runs
/// hooks.after_training, and returns the process exit code. Every error (bad flag, missing
/// data, corrupt file) is one line on stderr and a non-zero exit; an exception other than
/// minidl::Error (a library's) is named with what the run was doing ("error: while loading
/// the mnist data from 'd': ..."). Every output (--save, --metrics, --trace, --dump-graph,
/// --checkpoint-dir) is checked for writability before the data are read, and none is created
/// before the first training step has run (or there is nothing left to train). With several
/// ranks, an error before training on any rank, or settings, data sizes, model or binary that
/// differ between ranks, end every rank in the preflight, before any other collective, with one
/// line from rank 0 naming the ranks and the error or first difference. SIGINT and SIGTERM end
/// the process, after the output being written (checkpoint, --save, metrics) is complete.
///
/// Output of rank 0: a header line, one line per epoch and, when stdout is a terminal, a live
/// progress bar (progress.hpp); --quiet prints one final line instead. --metrics FILE writes
/// JSON lines: first {"config": {...}} with the run's settings, then one record per epoch.
///
/// Testing hooks: the environment variable MINIDL_TEST_KILL_AFTER_STEP=G makes every rank kill
/// itself (SIGKILL) right after training step G (counted from the start of training, the
/// checkpoint of that step written), so tests can interrupt a run at a known point;
/// MINIDL_TEST_KILL_RANK=R limits that to rank R. MINIDL_TEST_STALL_AFTER_STEP=G makes rank
/// MINIDL_TEST_STALL_RANK (default 0) sleep for MINIDL_TEST_STALL_SECONDS (default 600) after
/// step G, a stuck rank for the collective timeout or the stall warning to find.
/// MINIDL_TEST_SIGTERM_WHILE_CHECKPOINTING_STEP=G makes rank 0 raise SIGTERM while it writes the
/// checkpoint of step G (the checkpoint is finished first). MINIDL_TEST_NAN_AFTER_STEP=G writes a
/// NaN into the first element of the last parameter on every rank after step G (its checkpoint
/// written), so tests can watch the numerics checks catch it. MINIDL_TEST_FAIL_PREPARE_AT_STEP=G
/// makes preparing the batch of training step G fail on every rank (on the prefetch thread
/// unless --no-prefetch; TrainerOptions::fail_preparing_step). MINIDL_TEST_THROW_AT_STEP=G
/// throws std::out_of_range (what std::stoll throws) after step G on every rank.
int run_training_app(int argc, char** argv, const std::string& description, AppConfig config,
                     const ModelBuilder& build, const AppHooks& hooks = {});

}  // namespace minidl
