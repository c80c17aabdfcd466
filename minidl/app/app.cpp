#include "minidl/app/app.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>
#include <thread>

#include "minidl/app/flags.hpp"
#include "minidl/app/progress.hpp"
#include "minidl/app/simulated.hpp"
#include "minidl/core/denormals.hpp"
#include "minidl/core/log.hpp"
#include "minidl/core/resident.hpp"
#include "minidl/core/text.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/frontend/checkpoint_shared.hpp"
#include "minidl/frontend/stage_times.hpp"
#include "minidl/frontend/trace.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/io/file.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/parallel/layout.hpp"
#include "minidl/parallel/preflight.hpp"
#include "minidl/parallel/tensor_parallel.hpp"
#include "minidl/parallel/traffic.hpp"
#include "minidl/train/loss.hpp"
#include "minidl/train/optimizer.hpp"
#include "minidl/train/tensor_parallel.hpp"

namespace minidl {

std::string AppConfig::prefetch_off() const {
  if (no_prefetch) return "--no-prefetch";
  // The compute threads that share this process's CPUs: its own OpenMP threads, times the ranks
  // of this node when it may run on every CPU of the node (mpirun --bind-to none); a rank bound
  // to cores of its own shares them with no other.
  const int cpus = allowed_cpus();
  const int ranks = ranks_on_host();
  const int node = static_cast<int>(std::thread::hardware_concurrency());
  const int compute = max_threads() * (cpus >= node ? ranks : 1);
  if (cpus > compute) return "";
  return fmt::format("no CPU left for a prefetch thread: {} compute thread(s) on {} CPU(s)",
                     compute, cpus);
}

bool AppConfig::prefetch() const { return prefetch_off().empty(); }

std::vector<std::int64_t> AppConfig::hidden_sizes() const {
  std::vector<std::int64_t> sizes;
  if (hidden.empty() || hidden == "none") return sizes;
  std::size_t start = 0;
  while (start <= hidden.size()) {
    const std::size_t end = std::min(hidden.find(',', start), hidden.size());
    const std::string item = hidden.substr(start, end - start);
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MINIDL_CHECK(used == item.size() && !item.empty() && v > 0, "--hidden: '", hidden,
                 "' is not a comma-separated list of positive sizes (e.g. 256,128, or \"\" for "
                 "none)");
    sizes.push_back(v);
    start = end + 1;
  }
  return sizes;
}

namespace {

/// SIGINT and SIGTERM end the process at once (their default), except while an output is being
/// written and renamed into place: then they end it right after, so a checkpoint, --save or the
/// metrics are never left half-written; a second signal meanwhile ends it at once. A
/// process-wide handler, since any of the process's threads (OpenMP's, the prefetch thread,
/// MPI's) may receive the signal.
std::atomic<int> writing{0};
std::atomic<int> pending_signal{0};

void on_terminating_signal(int sig) {
  // A second signal while one waits ends the process at once (a write that never ends).
  if (writing.load() > 0 && pending_signal.exchange(sig) == 0) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_signal_handlers() {
  for (int sig : {SIGINT, SIGTERM}) std::signal(sig, on_terminating_signal);
}

/// While it lives, SIGINT and SIGTERM wait (see on_terminating_signal).
class WritingOutput {
 public:
  WritingOutput() { writing.fetch_add(1); }
  WritingOutput(const WritingOutput&) = delete;
  WritingOutput& operator=(const WritingOutput&) = delete;
  ~WritingOutput() {
    if (writing.fetch_sub(1) == 1) {
      if (const int sig = pending_signal.exchange(0); sig != 0) {
        std::signal(sig, SIG_DFL);
        std::raise(sig);
      }
    }
  }
};

/// Appends JSON lines to a file that is written whole at each epoch: a temporary file renamed
/// over the target, so a reader never sees a half-written line. Nothing is written before
/// start(): a run refused before its first step leaves no file.
class MetricsWriter {
 public:
  explicit MetricsWriter(std::string path) : path_(std::move(path)) {}
  void add(const nlohmann::json& record) {
    if (path_.empty()) return;
    // Text that is not UTF-8 is escaped where it enters (json_of); replace is the last resort
    // that keeps a stray byte from ending the run.
    text_ += record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (started_) flush();
  }
  void start() {
    started_ = true;
    if (!path_.empty()) flush();
  }

 private:
  void flush() {
    WritingOutput writing;
    write_file_atomically(path_, text_, "--metrics");
  }
  std::string path_;
  std::string text_;
  bool started_ = false;
};

/// Fails, before any work, unless every output of the run can be written: --save, --metrics,
/// --trace, --dump-graph, --checkpoint-dir (which need not exist yet). Creates nothing.
void check_outputs(const AppConfig& c) {
  const std::pair<const std::string*, std::string_view> files[] = {
      {&c.save, "--save"},
      {&c.metrics, "--metrics"},
      {&c.trace, "--trace"},
      {&c.dump_graph, "--dump-graph"},
      {&c.dump_schedule, "--dump-schedule"}};
  for (const auto& [path, flag] : files)
    if (!path->empty()) check_writable(*path, flag);
  if (!c.checkpoint_dir.empty()) check_writable_directory(c.checkpoint_dir, "--checkpoint-dir");
}

/// --pipeline-stages P: ranks / P data-parallel replicas per stage, M micro-batches per batch
/// (0: P), which are the layout's micro-shards in deterministic mode (--batch-size / M samples
/// each, shared out among a stage's replicas).
void apply_pipeline_flags(AppConfig& c, int ranks) {
  if (c.pipeline_stages <= 1) return;
  MINIDL_CHECK(ranks % c.pipeline_stages == 0, "--pipeline-stages ", c.pipeline_stages,
               " needs a multiple of ", c.pipeline_stages,
               " ranks (stages x data-parallel replicas); this job has ", ranks, " rank(s)");
  if (c.micro_batches == 0) c.micro_batches = c.pipeline_stages;
  MINIDL_CHECK(c.batch_size % c.micro_batches == 0, "--micro-batches ", c.micro_batches,
               " does not divide --batch-size ", c.batch_size);
  const int replicas = ranks / c.pipeline_stages;
  MINIDL_CHECK(c.micro_batches % replicas == 0, "--micro-batches ", c.micro_batches,
               " cannot be shared out equally among the ", replicas,
               " data-parallel replicas of each stage");
  if (c.deterministic) c.micro_batch = c.batch_size / c.micro_batches;
}

/// The metrics of an epoch of pipeline stages: pipeline_bubble, the stages' idle time over
/// their step time (all stages together), beside the ideal; per stage its bubble and its
/// seconds per step by kind.
nlohmann::json stage_times_record(const std::vector<StageTimes>& stages, std::int64_t steps,
                                  int micro) {
  StageTimes all;
  nlohmann::json per = nlohmann::json::array();
  const double n = static_cast<double>(std::max<std::int64_t>(steps, 1));
  for (const StageTimes& t : stages) {
    all.idle += t.idle;
    all.forward += t.step() - t.idle;
    per.push_back({{"bubble", t.bubble()},
                   {"forward_seconds", t.forward / n},
                   {"backward_seconds", t.backward / n},
                   {"update_seconds", t.update / n},
                   {"communication_seconds", t.communication / n},
                   {"idle_seconds", t.idle / n}});
  }
  return {{"pipeline_bubble", all.bubble()},
          {"pipeline_bubble_ideal", ideal_bubble(static_cast<int>(stages.size()), micro)},
          {"pipeline_stage_times", per}};
}

/// Writes the graph to path (--dump-graph), as DOT when it ends in ".dot", else as text.
void write_graph(const ir::Graph& g, const std::string& path) {
  const std::string text = path.ends_with(".dot") ? ir::to_dot(g) : ir::to_text(g);
  write_file_atomically(path, text, "graph dump");
}

/// The --profile table: kernel time per node over the training steps after each program's first,
/// largest first. The first step writes the memory plan's buffers for the first time (the
/// operating system's page faults: on a large plan several times a later step's time in the
/// memory-bound kernels) and runs each library primitive once; its kernel time is given apart.
/// A run of one step per program has no other and shows that. With several ranks, the time is
/// rank 0's and min/max give the spread over the ranks (every rank runs the same nodes:
/// preflight checked the graphs). Collective.
void print_kernel_times(parallel::Communicator& comm, std::vector<Trainer::KernelTime> rows,
                        bool print) {
  const bool after_first =
      std::any_of(rows.begin(), rows.end(), [](const auto& r) { return r.calls > r.first_calls; });
  double first_total = 0.0;
  for (auto& r : rows) {
    first_total += r.first_seconds;
    if (!after_first || r.calls == 0) continue;
    r.flops *= static_cast<double>(r.calls - r.first_calls) / static_cast<double>(r.calls);
    r.calls -= r.first_calls;
    r.seconds -= r.first_seconds;
  }
  const int ranks = comm.size();
  std::vector<double> all;
  std::int64_t count = static_cast<std::int64_t>(rows.size()), min_count = count;
  if (ranks > 1) {
    std::vector<std::int64_t> counts(static_cast<std::size_t>(ranks));
    comm.allgather(&count, counts.data(), sizeof(count));
    min_count = *std::min_element(counts.begin(), counts.end());
    if (min_count == *std::max_element(counts.begin(), counts.end())) {
      std::vector<double> mine;
      for (const auto& r : rows) mine.push_back(r.seconds);
      all.resize(mine.size() * static_cast<std::size_t>(ranks));
      comm.allgather(mine.data(), all.data(),
                     static_cast<std::int64_t>(mine.size() * sizeof(double)));
    }
  }
  if (!print) return;
  const bool spread = !all.empty();
  std::vector<std::pair<double, double>> range(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    range[i] = {rows[i].seconds, rows[i].seconds};
    for (int r = 0; spread && r < ranks; ++r) {
      const double t = all[static_cast<std::size_t>(r) * rows.size() + i];
      range[i] = {std::min(range[i].first, t), std::max(range[i].second, t)};
    }
  }
  std::vector<std::size_t> order(rows.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return rows[a].seconds > rows[b].seconds; });
  double total = 0.0;
  for (const auto& r : rows) total += r.seconds;
  const std::string first =
      after_first ? fmt::format(
                        "; the first steps' kernels took {:.3f} s (first touch of the "
                        "buffers, libraries' first runs)",
                        first_total)
                  : std::string();
  fmt::print("\nkernel time per node (training steps{}, {:.3f} s in kernels on rank 0{}{}):\n",
             after_first ? " after each program's first" : "", total,
             spread ? fmt::format("; min/max over {} ranks", ranks) : std::string(), first);
  fmt::print("{:>9} {:>6} {:>19} {:>8} {:>9} {:>8}  {:<22} {:<10} {}\n", "total ms", "share",
             spread ? "min/max ms" : "", "calls", "us/call", "GFLOP/s", "op", "kernel", "node");
  for (std::size_t i : order) {
    const auto& r = rows[i];
    const std::string minmax =
        spread ? fmt::format("{:.1f}/{:.1f}", 1e3 * range[i].first, 1e3 * range[i].second) : "";
    const std::string gflops =
        r.flops > 0 && r.seconds > 0 ? fmt::format("{:.1f}", r.flops / r.seconds * 1e-9) : "";
    fmt::print("{:>9.1f} {:>5.1f}% {:>19} {:>8} {:>9.1f} {:>8}  {:<22} {:<10} {}\n",
               1e3 * r.seconds, total > 0 ? 100.0 * r.seconds / total : 0.0, minmax, r.calls,
               r.calls ? 1e6 * r.seconds / static_cast<double>(r.calls) : 0.0, gflops, r.op,
               r.kernel, r.node);
  }
  if (ranks > 1 && !spread)
    fmt::print("(ranks ran different numbers of nodes: the times are rank 0's alone)\n");
}

/// --metrics' record of the --profile table (rank 0's): per node its op, category, whether it
/// communicates (ir::CommRole: what --compute-table leaves running), calls, seconds and
/// elements per call (what scripts/simulate-cluster makes a compute table of).
nlohmann::json kernel_times_json(const std::vector<Trainer::KernelTime>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    const ir::OpDef* def = ops::find_op(r.op);
    out.push_back({{"node", r.node},
                   {"op", r.op},
                   {"category", r.category},
                   {"communicates", def != nullptr && def->comm_role() != ir::CommRole::None},
                   {"calls", r.calls},
                   {"seconds", r.seconds},
                   {"first_calls", r.first_calls},
                   {"first_seconds", r.first_seconds},
                   {"elements", r.elements}});
  }
  return out;
}

/// More OpenMP threads on this machine than cores, with threads that spin when idle (OpenMP's
/// default), make every parallel region wait for preempted threads: say how to avoid it.
void warn_if_spinning_oversubscribed(const std::string& program) {
  const int ranks = ranks_on_host();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const bool passive = policy != nullptr && std::string_view(policy) == "passive";
  if (cores > 0 && ranks * max_threads() > cores && !passive) {
    fmt::print(stderr,
               "{}: note: {} rank(s) x {} thread(s) on {} cores: set OMP_WAIT_POLICY=passive "
               "(mpirun -x OMP_WAIT_POLICY=passive), or idle threads spin on the cores the others "
               "need\n",
               program, ranks, max_threads(), cores);
  }
}

/// What a checkpoint of this model and optimizer holds (a collective with ZeRO, which gathers
/// the optimizer state's pieces, and with pipeline stages, which gathers the stages').
checkpoint::Tensors checkpoint_tensors(nn::Module& model, Trainer& trainer) {
  trainer.gather_stages();
  return {train::gather_parameters(model), model.buffers(), trainer.optimizer_state()};
}

/// A testing hook's value (see run_training_app): fallback when the variable is unset, else an
/// integer of at least `least` (a step number, a rank).
std::int64_t test_hook(const char* variable, std::int64_t fallback, std::int64_t least) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  MINIDL_CHECK(*end == '\0' && x >= least, variable, " is '", v, "', expected ",
               least > 0 ? "a positive step number" : "a rank");
  return x;
}

/// The one-line message of the exception being handled (call it in a catch block): a
/// minidl::Error's own text, else what the run was `doing` and the library's text.
std::string current_error(const std::string& doing) {
  try {
    throw;
  } catch (const Error& e) {
    return e.what();
  } catch (const std::bad_alloc&) {
    return "out of memory while " + doing;
  } catch (const std::exception& e) {
    return fmt::format("while {}: {}", doing, printable(e.what(), 1000));
  } catch (...) {
    return fmt::format("while {}: an exception of an unknown type", doing);
  }
}

/// The build this process runs: the program's name and the size and hash of its executable,
/// so that ranks started from different builds differ in preflight.
std::string build_identity(const std::string& program) {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  std::uint64_t hash = 0xcbf29ce484222325ULL, bytes = 0;
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    for (std::size_t i = 0; i < n; ++i)
      hash = (hash ^ static_cast<unsigned char>(buffer[i])) * 0x100000001b3ULL;
    bytes += n;
  }
  return fmt::format("binary {} ({} bytes, hash {:016x})", program, bytes, hash);
}

// The replicas x shards layout of --tensor-parallel (connected after the preflight), and the
// combinations it does not support; the flag table refuses the flags it excludes outright.
std::unique_ptr<parallel::TensorParallelComms> tensor_parallel_comms(const AppConfig& c,
                                                                     parallel::Communicator& comm) {
  MINIDL_CHECK(c.thread_mode != "replicas", "--tensor-parallel ", c.tensor_parallel,
               " does not combine with --thread-mode replicas (use intra-op)");
  MINIDL_CHECK(c.reduce == "allreduce", "--tensor-parallel ", c.tensor_parallel,
               " reduces the gradients over each shard's replicas with --reduce allreduce only, "
               "got --reduce ",
               c.reduce);
  return std::make_unique<parallel::TensorParallelComms>(comm, c.tensor_parallel);
}

/// Refuses sizes that would train nothing or leave a rank without samples, naming the flags.
void check_sizes(const AppConfig& c, std::int64_t train_samples, std::int64_t test_samples,
                 int ranks) {
  MINIDL_CHECK(train_samples > 0, "the training set is empty (--train-limit ", c.train_limit,
               ", --dataset ", c.dataset, ")");
  MINIDL_CHECK(test_samples > 0, "the test set is empty (--test-limit ", c.test_limit,
               ", --dataset ", c.dataset, ")");
  const std::int64_t batch = c.batch_size * c.accumulate;
  MINIDL_CHECK(Trainer::steps_per_epoch(train_samples, batch, ranks) > 0, train_samples,
               " training sample(s) cannot give each of the ", ranks,
               " ranks a sample: no training step would run; use more samples (--train-limit) or "
               "fewer ranks (mpirun -np)");
  if (c.deterministic) {
    // Every batch, the last one too, must give every rank a micro-shard.
    const parallel::Layout layout({.ranks = ranks, .micro_batch = c.micro_batch});
    const std::int64_t last = train_samples % batch;
    layout.check_batch(std::min(batch, train_samples),
                       "a batch (--batch-size x --accumulate, --train-limit)");
    if (last != 0) layout.check_batch(last, "the last batch (--train-limit, --batch-size)");
  }
}

/// doing: what the run is doing, for the message of an error that does not say it itself.
int run_training(const std::string& program, AppConfig& c, const ModelBuilder& build,
                 const AppHooks& hooks, std::string& doing) {
  parallel::Communicator& comm = parallel::world();
  const bool root = comm.rank() == 0;
  install_signal_handlers();
  // Everything up to the preflight is this rank's alone (no collective): an error here goes to
  // the preflight, which ends every rank with it, so no rank waits for one that failed.
  DatasetSplits data;
  Shape sample;
  std::unique_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<train::Loss> loss;
  std::unique_ptr<optim::LrSchedule> schedule;
  TrainerOptions topt;
  std::unique_ptr<parallel::TensorParallelComms> tensor;
  std::unique_ptr<Trainer> trainer_ptr;
  std::string description, error;
  try {
    (void)c.hidden_sizes();
    apply_simulated_rules(c);
    set_denormals(c.denormals == "keep" ? Denormals::Keep : Denormals::Flush);
    if (c.threads > 0) set_num_threads(c.threads);
    if (c.tensor_parallel > 1) tensor = tensor_parallel_comms(c, comm);
    // Before the first collective (the preflight).
    comm.set_timeout(c.collective_timeout);
    doing = "checking the output paths";
    if (root) check_outputs(c);
    const std::string dir = c.data.empty() ? "data/" + c.dataset : c.data;
    doing = fmt::format("loading the {} data from '{}'", c.dataset, printable(dir));
    apply_pipeline_flags(c, comm.size());
    data = simulated_shared_data(c, dir, [&] {
      const DatasetSplits all = load_dataset(c.dataset, dir);
      DatasetSplits d{take(all.train, c.train_limit), take(all.test, c.test_limit)};
      d.train = upscale(d.train, c.upscale);
      d.test = upscale(d.test, c.upscale);
      check_sizes(c, d.train.size(), d.test.size(),
                  comm.size() / c.tensor_parallel / std::max<int>(c.pipeline_stages, 1));
      if (c.normalize) {
        const ChannelStats stats = channel_stats(d.train);
        normalize_channels(d.train, stats);
        normalize_channels(d.test, stats);
      }
      return d;
    });
    const auto& dims = data.train.images.shape().dims();
    sample = Shape(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
    // After the data (which stays real), before the model's and the runs' buffers.
    topt.compile.injected = simulated_compute(c);
    doing = "building the model";
    model = build(c, sample);
    model->reset(c.seed);
    doing = fmt::format("loading --init '{}'", printable(c.init));
    if (!c.init.empty()) nn::load_state_dict(*model, c.init);
    // Each rank keeps its parts of the parameters of the Linear pairs split over the shards, cut
    // from the whole initial values; a model it cannot split fails here, before the preflight.
    doing = "splitting the model over the tensor-parallel shards";
    if (tensor) train::shard_split_parameters(*model, sample, tensor->tensor());
    doing = "setting up the training";
    if (c.optimizer == "adamw") {
      optimizer =
          std::make_unique<optim::AdamW>(optim::AdamWOptions{.lr = c.lr,
                                                             .beta1 = c.beta1,
                                                             .beta2 = c.beta2,
                                                             .eps = c.eps,
                                                             .weight_decay = c.weight_decay});
    } else {
      optimizer = std::make_unique<optim::Sgd>(optim::SgdOptions{.lr = c.lr,
                                                                 .momentum = c.momentum,
                                                                 .nesterov = c.nesterov,
                                                                 .weight_decay = c.weight_decay});
    }
    loss = train::make_loss(c.loss, c.label_smoothing);
    // The schedule counts optimizer steps, each of --accumulate micro-batches.
    const std::int64_t steps_per_epoch = std::max<std::int64_t>(
        1, Trainer::steps_per_epoch(data.train.size(), c.batch_size * c.accumulate,
                                    comm.size() / c.tensor_parallel));
    schedule = std::make_unique<optim::LrSchedule>(
        c.lr,
        optim::ScheduleOptions{.kind = optim::parse_schedule(c.lr_schedule),
                               .step_epochs = c.lr_step_epochs,
                               .gamma = c.lr_gamma,
                               .warmup_steps = c.warmup_steps},
        steps_per_epoch, steps_per_epoch * c.epochs);
    topt.batch_size = c.batch_size;
    topt.accumulate = c.accumulate;
    topt.seed = c.seed;
    topt.shuffle = !c.no_shuffle;
    topt.compile.backend = c.backend == "onednn" ? ir::Backend::OneDnn : ir::Backend::Native;
    topt.compile.precision = ops::parse_precision(c.precision);
    topt.compile.profile = c.profile;
    topt.compile.trace = !c.trace.empty();
    topt.compile.check_numerics = c.check_numerics;
    topt.fuse = !c.no_fuse;
    topt.replicas = c.thread_mode == "replicas" ? max_threads() : 1;
    MINIDL_CHECK(!c.deterministic || c.reduce != "root",
                 "--reduce root does not apply with --deterministic (allowed there: allreduce, "
                 "hierarchical)");
    topt.reduce_strategy = parallel::parse_reduce_strategy(c.reduce);
    topt.bucket_bytes = static_cast<std::int64_t>(c.bucket_mb * 1024 * 1024);
    topt.overlap = c.overlap;
    topt.sync_batch_stats = c.sync_bn;
    topt.micro_batch = c.deterministic ? c.micro_batch : 0;
    topt.clip_grad_norm = c.clip_grad_norm;
    topt.zero = c.zero;
    if (tensor) {
      topt.comm = &tensor->data();
      topt.tensor_comm = &tensor->tensor();
    }
    topt.pipeline_stages = c.pipeline_stages;
    topt.pipeline_schedule = c.schedule;
    topt.pipeline_balance = c.stage_balance;
    for (std::size_t at = 0; !c.stage_boundaries.empty() && at <= c.stage_boundaries.size();) {
      const std::size_t comma =
          std::min(c.stage_boundaries.find(',', at), c.stage_boundaries.size());
      topt.pipeline_boundaries.push_back(c.stage_boundaries.substr(at, comma - at));
      at = comma + 1;
    }
    // Each replica of a stage runs its share of the micro-batches.
    if (c.pipeline_stages > 1)
      topt.replicas = static_cast<int>(c.micro_batches) / (comm.size() / c.pipeline_stages);
    topt.loss = loss.get();
    topt.targets =
        c.reconstruct ? TrainerOptions::Targets::Inputs : TrainerOptions::Targets::Labels;
    topt.schedule = schedule.get();
    topt.augment = train::Augment::parse(c.augment);
    topt.prefetch = c.prefetch();
    topt.fail_preparing_step = test_hook("MINIDL_TEST_FAIL_PREPARE_AT_STEP", 0, 1);
    doing = "compiling the training graph";
    trainer_ptr = std::make_unique<Trainer>(*model, *optimizer, topt);
    // What every rank must share: the build, the flags, the data's sizes, the model with its
    // parameters' names and shapes, the optimizer, schedule and loss as they were made.
    description = build_identity(program) + "\n" + ranks_must_agree(c, hooks.flags);
    description += fmt::format("data {} train, {} test samples of {}\nmodel {}\n",
                               data.train.size(), data.test.size(), sample, model->describe());
    for (const auto& [name, t] : model->state_dict())
      description += fmt::format("tensor {} {} {}\n", name, t.shape(), t.dtype());
    description += fmt::format("optimizer {}\nschedule {}\nloss {}\n", optimizer->describe(),
                               schedule->describe(), loss->name());
  } catch (...) {
    error = current_error(doing);
  }
  doing = "checking that the ranks agree";
  parallel::preflight(comm, description, error);
  if (tensor) tensor->connect();  // the first collective after the preflight
  Trainer& trainer = *trainer_ptr;
  Dataset& train_set = data.train;
  Dataset& test_set = data.test;
  // The graphs' preflight (collective): before the parameters' broadcast, so that a model of
  // another shape fails there rather than in a broadcast of another size.
  trainer.check_ranks_agree(train_set);
  doing = "setting up the training";
  // Every rank starts from rank 0's parameters and buffers (they agree already when seeds agree;
  // this makes it so whatever the initialisation).
  // With tensor parallelism, the ranks holding the same parts (the replicas of a shard).
  parallel::Communicator& replicas = tensor ? tensor->data() : comm;
  for (auto& [name, t] : model->state_dict()) replicas.broadcast(t.raw(), t.nbytes(), 0);
  const bool talk = root && !c.quiet;  // headers, per-epoch lines, notes
  if (talk) warn_if_spinning_oversubscribed(program);
  const std::int64_t kill_after = test_hook("MINIDL_TEST_KILL_AFTER_STEP", 0, 1);
  const std::int64_t kill_only = test_hook("MINIDL_TEST_KILL_RANK", -1, 0);
  const std::int64_t stall_after = test_hook("MINIDL_TEST_STALL_AFTER_STEP", 0, 1);
  const std::int64_t stall_rank = test_hook("MINIDL_TEST_STALL_RANK", 0, 0);
  const std::int64_t stall_seconds = test_hook("MINIDL_TEST_STALL_SECONDS", 600, 1);
  const std::int64_t signal_at = test_hook("MINIDL_TEST_SIGTERM_WHILE_CHECKPOINTING_STEP", 0, 1);
  const std::int64_t nan_after = test_hook("MINIDL_TEST_NAN_AFTER_STEP", 0, 1);
  const std::int64_t throw_at = test_hook("MINIDL_TEST_THROW_AT_STEP", 0, 1);
  if (!c.checkpoint_dir.empty() && c.checkpoint_every == 0 && c.checkpoint_every_steps == 0)
    c.checkpoint_every = 1;
  std::int64_t n_params = 0;
  const auto shards = model->parameter_shards();
  for (const auto& [name, t] : model->parameters()) {
    const train::ParameterShard* s = train::find_shard(shards, name);
    n_params += s != nullptr ? s->whole.numel() : t.numel();  // a part's whole tensor
  }
  RunFacts facts{.program = program,
                 .model = model->describe(),
                 .parameters = n_params,
                 .train_samples = train_set.size(),
                 .test_samples = test_set.size(),
                 .ranks = comm.size(),
                 .threads = max_threads(),
                 .optimizer = optimizer->describe(),
                 .schedule = schedule->describe()};
  const std::vector<checkpoint::Setting> settings = checkpoint_settings(c, facts);

  int first_epoch = 1;
  std::int64_t first_sample = 0, first_epoch_step = 0;
  std::string resumed, resumed_from;  // what to say about it after the header; the file
  if (!c.resume.empty()) {
    doing = fmt::format("resuming from '{}'", printable(c.resume));
    const checkpoint::Tensors into = checkpoint_tensors(*model, trainer);
    const checkpoint::Loaded ckpt = checkpoint::load_shared(comm, c.resume, into);
    train::load_parameters(*model, into.parameters);  // sharded ones: their parts
    trainer.set_optimizer_state(into.optimizer_state);
    // Rank 0 judges; on an error it ends the job, the others waiting in their first step.
    if (root) {
      for (const std::string& note : checkpoint::check_settings(ckpt, settings))
        if (talk) fmt::print(stderr, "{}: note: {}\n", program, note);
    }
    trainer.resume(ckpt.position);
    first_epoch = ckpt.position.epoch;
    first_sample = ckpt.position.next_sample;
    first_epoch_step = ckpt.position.epoch_step;
    resumed_from = ckpt.path;
    resumed = fmt::format(
        "{}: resumed from {}: {} epoch(s) done, {} step(s) into epoch {} "
        "(training step {})\n",
        program, ckpt.path, first_epoch - 1, ckpt.position.epoch_step, first_epoch,
        ckpt.position.step);
    if (first_epoch > c.epochs)
      resumed += fmt::format("{}: nothing left to train with --epochs {}\n", program, c.epochs);
  }

  std::error_code exists_ec;
  if (!c.checkpoint_dir.empty() && root && std::filesystem::exists(c.checkpoint_dir, exists_ec)) {
    doing = fmt::format("checking --checkpoint-dir '{}'", printable(c.checkpoint_dir));
    // Checkpoints of another run, or of this one from further on, would mix with the new ones
    // (and --resume of the directory would take the newest).
    const std::vector<std::string> later =
        checkpoint::list_after(c.checkpoint_dir, first_epoch - 1, first_epoch_step);
    MINIDL_CHECK(later.empty(), "--checkpoint-dir '", c.checkpoint_dir, "' already holds ",
                 later.size(), " checkpoint(s) past where this run starts, up to '", later.back(),
                 "': continue from them (--resume ", c.checkpoint_dir,
                 ") or use another directory");
  }

  MetricsWriter metrics(root ? c.metrics : std::string());
  facts.resumed_from = resumed_from;
  facts.first_epoch = first_epoch;
  nlohmann::json config = nlohmann::json::parse(metrics_config(c, facts));
  {
    // Every rank's bytes of parameters, reduced gradients, optimizer state and activations.
    const train::MemoryUse m = trainer.memory(sample);
    log_verbose("memory",
                "rank {}: parameters {} B, gradients {} B, optimizer state {} B, activations {} B",
                comm.rank(), m.parameters, m.gradients, m.optimizer_state, m.activations);
    const std::int64_t mine[4] = {m.parameters, m.gradients, m.optimizer_state, m.activations};
    std::vector<std::int64_t> all(4 * static_cast<std::size_t>(comm.size()));
    comm.allgather(mine, all.data(), sizeof mine);
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < comm.size(); ++r) {
      const std::int64_t* x = all.data() + 4 * r;
      ranks.push_back({{"rank", r},
                       {"parameters", x[0]},
                       {"gradients", x[1]},
                       {"optimizer_state", x[2]},
                       {"activations", x[3]}});
    }
    config["memory_bytes"] = ranks;
  }
  metrics.add({{"config", config}});
  // The outputs come into being only once the run is known to work: its first step has run
  // (the ranks agreed in the preflight), or there is nothing left to train. Rank 0 alone, and
  // no collective.
  bool outputs_started = false;
  auto start_outputs = [&] {
    if (outputs_started || !root) return;
    outputs_started = true;
    const std::string was = doing;
    if (!c.checkpoint_dir.empty()) {
      doing = fmt::format("creating --checkpoint-dir '{}'", printable(c.checkpoint_dir));
      std::error_code ec;
      std::filesystem::create_directories(c.checkpoint_dir, ec);
      MINIDL_CHECK(!ec, "--checkpoint-dir: cannot create '", c.checkpoint_dir, "': ", ec.message());
    }
    doing = fmt::format("writing --dump-graph '{}'", printable(c.dump_graph));
    if (!c.dump_graph.empty()) write_graph(trainer.training_graph(sample), c.dump_graph);
    doing = fmt::format("writing --dump-schedule '{}'", printable(c.dump_schedule));
    if (!c.dump_schedule.empty())
      write_file_atomically(
          c.dump_schedule,
          train::format_schedule(train::make_schedule(
              c.schedule, c.pipeline_stages,
              static_cast<int>(c.micro_batches) / (comm.size() / c.pipeline_stages))),
          "schedule dump");
    doing = fmt::format("writing --metrics '{}'", printable(c.metrics));
    metrics.start();
    doing = was;
  };

  if (talk) {
    fmt::print(
        "{}: {} on {}{} ({} train, {} test samples), {} parameters, {} rank(s) x {} "
        "thread(s) ({}), {} kernels{}{}\n",
        program, model->describe(), c.dataset, c.normalize ? " (normalised per channel)" : "",
        train_set.size(), test_set.size(), n_params, comm.size(), max_threads(),
        c.deterministic ? fmt::format("deterministic, micro-batch {}", c.micro_batch)
                        : c.thread_mode,
        c.backend, c.precision == "f32" ? "" : ", " + c.precision + " products",
        topt.augment.any() ? ", training images augmented: " + topt.augment.describe() : "");
    fmt::print("{}", resumed);
    std::fflush(stdout);
  }
  Progress progress(root ? progress_mode(stdout, c.quiet) : ProgressMode::Quiet, c.epochs);
  // Every rank takes part (the position's statistics are reduced); rank 0 writes, and the
  // others wait until the file is in place.
  auto save_checkpoint = [&] {
    // On every rank: mpirun signals them all, and one that ended at once would make it kill
    // rank 0 in the middle of the file.
    WritingOutput writing;
    const TrainerPosition pos = trainer.position();
    const checkpoint::Tensors tensors = checkpoint_tensors(*model, trainer);
    if (root) {
      // A SIGTERM that arrives while the checkpoint is written ends the process once it is.
      if (signal_at > 0 && pos.step == signal_at) std::raise(SIGTERM);
      const std::string path =
          checkpoint::save(c.checkpoint_dir, pos, tensors, checkpoint::settings_metadata(settings),
                           c.checkpoint_keep);
      if (talk) {
        progress.clear();
        fmt::print("           checkpoint {}\n", path);
        std::fflush(stdout);
      }
    }
    comm.barrier();
  };
  bool stopped = false;  // --max-steps reached
  // The bytes this rank's training steps handed to collectives (parallel/traffic.hpp): counted
  // from the end of one step's callback to the next step's, so checkpoints are left out.
  std::int64_t step_bytes = 0, steps_counted = 0, bytes_mark = 0;
  auto on_step = [&](const StepInfo& info) {
    step_bytes += parallel::collective_bytes() - bytes_mark;
    ++steps_counted;
    struct Mark {
      std::int64_t& at;
      ~Mark() { at = parallel::collective_bytes(); }
    } mark{bytes_mark};
    start_outputs();
    progress.update(info.position, info.running_loss);
    if (c.max_steps > 0 && info.step >= c.max_steps) {
      trainer.request_stop();
      stopped = true;
    }
    if (c.checkpoint_every_steps > 0 && info.step % c.checkpoint_every_steps == 0)
      save_checkpoint();
    if (kill_after > 0 && info.step == kill_after && (kill_only < 0 || kill_only == comm.rank())) {
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (stall_after > 0 && info.step == stall_after && comm.rank() == stall_rank)
      std::this_thread::sleep_for(std::chrono::seconds(stall_seconds));
    // What std::stoll throws: an exception that is not minidl::Error must end the run cleanly.
    if (throw_at > 0 && info.step == throw_at) throw std::out_of_range("stoll");
    if (nan_after > 0 && info.step == nan_after) {
      // The last parameter (the output layer's bias in the examples): no ReLU after it would
      // turn the NaN into 0. A Tensor is a handle: the copy writes the parameter's storage.
      const Tensor t = model->parameters().back().second;
      t.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    }
  };
  EvalStats last{};
  bool evaluated = false;
  double data_wait = 0.0, data_prepare = 0.0;  // over the epochs, for the --profile summary
  // Pipeline stages with --profile: each stage's time by kind, this epoch's (the profile counts
  // from the first step).
  const bool staged = c.pipeline_stages > 1 && c.profile;
  const int stage_micro = staged ? static_cast<int>(c.micro_batches) /
                                       (comm.size() / static_cast<int>(c.pipeline_stages))
                                 : 0;
  StageTimes stage_times_before;
  for (int epoch = first_epoch; epoch <= c.epochs; ++epoch) {
    doing = fmt::format("training epoch {}", epoch);
    progress.start_epoch(epoch, train_set.size(), epoch == first_epoch ? first_sample : 0);
    step_bytes = steps_counted = 0;
    bytes_mark = parallel::collective_bytes();
    const EpochStats s = trainer.train_epoch(train_set, epoch, on_step);
    data_wait += s.data_wait_seconds;
    data_prepare += s.data_prepare_seconds;
    const EvalStats e = trainer.evaluate(test_set);
    last = e;
    evaluated = true;
    const double sps = static_cast<double>(s.timed_samples) / s.seconds;
    std::vector<StageTimes> stages;  // a collective: every rank, at the same point
    if (staged) {
      const StageTimes total = stage_times(trainer.training_executables());
      stages = gather_stage_times(comm, total - stage_times_before, c.pipeline_stages);
      stage_times_before = total;
    }
    progress.clear();
    if (talk) {
      const std::string quality = loss->classification()
                                      ? fmt::format("train acc {:6.2f}%  test acc {:6.2f}%",
                                                    100.0 * s.accuracy, 100.0 * e.accuracy)
                                      : fmt::format("test loss {:.5f}", e.loss);
      const std::string extra =
          (c.lr_schedule != "constant" || c.warmup_steps > 0 ? fmt::format("  lr {:.3g}", s.lr)
                                                             : std::string()) +
          (c.clip_grad_norm > 0 ? fmt::format("  grad norm {:.3f}", s.grad_norm) : std::string());
      fmt::print("epoch {:>2}/{}  loss {:.4f}  {}  {:.2f} s  {:.0f} samples/s{}\n", epoch, c.epochs,
                 s.loss, quality, s.seconds, sps, extra);
      if (c.profile) {
        // "data": the main thread's wait for its batches; the preparation's own time beside it
        // shows whether the prefetch thread hid it.
        fmt::print(
            "           compute {:.3f} s  communication {:.3f} s  waiting {:.3f} s  data {:.3f} s "
            "(preparing {:.3f} s {})\n",
            s.seconds - s.comm_seconds - s.wait_seconds - s.data_wait_seconds, s.comm_seconds,
            s.wait_seconds, s.data_wait_seconds, s.data_prepare_seconds,
            topt.prefetch ? "on the prefetch thread" : "on the main thread");
        if (s.flops > 0 && s.timed_samples > 0) {
          fmt::print(
              "           {:.1f} GFLOP/s in the products and convolutions ({:.2f} MFLOP per "
              "sample, forward and backward)\n",
              s.flops / s.seconds / 1e9, s.flops / static_cast<double>(s.timed_samples) / 1e6);
        }
        if (staged)
          fmt::print("{}", format_stage_times(stages, steps_counted, stage_micro, "           "));
      }
      std::fflush(stdout);
    }
    nlohmann::json record = {
        {"epoch", epoch},
        {"train_loss", s.loss},
        {"test_loss", e.loss},
        {"epoch_seconds", s.seconds},
        {"samples_per_second", sps},
        {"flops", s.flops},
        {"flops_per_sample",
         s.timed_samples > 0 ? s.flops / static_cast<double>(s.timed_samples) : 0.0},
        {"gflops_per_second", s.flops / s.seconds / 1e9},
        {"comm_seconds", s.comm_seconds},
        {"wait_seconds", s.wait_seconds},
        {"steps", steps_counted},
        {"comm_bytes_per_step", steps_counted > 0 ? step_bytes / steps_counted : 0},
        {"data_wait_seconds", s.data_wait_seconds},
        {"data_prepare_seconds", s.data_prepare_seconds},
        {"lr", s.lr}};
    if (staged) record.update(stage_times_record(stages, steps_counted, stage_micro));
    if (loss->classification()) {
      record["train_accuracy"] = s.accuracy;
      record["test_accuracy"] = e.accuracy;
    }
    if (c.clip_grad_norm > 0) record["grad_norm"] = s.grad_norm;
    start_outputs();  // an epoch without a step (all of it done before a resume)
    metrics.add(record);
    if (c.checkpoint_every > 0 && epoch % c.checkpoint_every == 0 && !stopped) save_checkpoint();
    if (stopped) break;
  }
  doing = "evaluating";
  start_outputs();  // nothing was left to train
  if (c.quiet) {
    if (!evaluated) last = trainer.evaluate(test_set);
    if (root) {
      // What was trained: the epochs, or the steps --max-steps stopped at.
      const std::string done =
          stopped ? fmt::format("{} step(s)", c.max_steps) : fmt::format("{} epoch(s)", c.epochs);
      if (loss->classification()) {
        fmt::print("{}: {}  test loss {:.4f}  test acc {:.2f}%\n", program, done, last.loss,
                   100.0 * last.accuracy);
      } else {
        fmt::print("{}: {}  test loss {:.6f}\n", program, done, last.loss);
      }
      std::fflush(stdout);
    }
  }
  if (c.profile) {
    print_kernel_times(comm, trainer.kernel_times(), talk);
    metrics.add({{"kernel_times", kernel_times_json(trainer.kernel_times())}});
    if (talk) {
      // Whether preparing the batches was hidden behind the steps: the main thread's wait
      // against the time the preparation took.
      fmt::print(
          "data (training batches, rank 0): the steps waited {:.3f} s for their batches; "
          "preparing them (gather{}) took {:.3f} s {}\n",
          data_wait, topt.augment.any() ? ", augment " + topt.augment.describe() : "", data_prepare,
          !topt.prefetch
              ? fmt::format("on the main thread ({})", c.prefetch_off())
              : fmt::format("on the prefetch thread, {:.0f}% of it hidden",
                            data_prepare > 0
                                ? 100.0 * std::max(0.0, data_prepare - data_wait) / data_prepare
                                : 100.0));
    }
  }
  {
    // Every rank's peak resident memory over the run (VmHWM), for the memory figures above.
    const std::int64_t peak = peak_resident_bytes();
    log_verbose("memory", "rank {}: peak resident {} B", comm.rank(), peak);
    std::vector<std::int64_t> peaks(static_cast<std::size_t>(comm.size()));
    comm.allgather(&peak, peaks.data(), sizeof peak);
    metrics.add({{"peak_rss_bytes", peaks}});
  }
  if (!c.trace.empty()) {
    doing = fmt::format("writing --trace '{}'", printable(c.trace));
    const std::size_t events = write_chrome_trace(c.trace, comm, trainer.trace_spans());
    if (talk) fmt::print("{}: wrote {} ({} kernel calls)\n", program, c.trace, events);
  }
  // The parameters stored as parts, whole again on every rank (collective) for what follows.
  if (tensor && (!c.save.empty() || hooks.after_training)) train::unshard_parameters(*model);
  if (!c.save.empty() && root) {
    doing = fmt::format("writing --save '{}'", printable(c.save));
    WritingOutput writing;
    nn::save_state_dict(*model, c.save);
  }
  doing = "writing the example's outputs after training";
  if (hooks.after_training && root) hooks.after_training(c, *model, test_set);
  return 0;
}

}  // namespace

int run_training_app(int argc, char** argv, const std::string& description, AppConfig c,
                     const ModelBuilder& build, const AppHooks& hooks) {
  const parallel::SimulatedRankScope simulated_rank;  // a simulated rank finalises on return
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  // The example's own choice of datasets: a mistake here is the program's, not the user's.
  const std::vector<std::string> known = dataset_names();
  for (const std::string& d : c.datasets) {
    MINIDL_ASSERT(std::find(known.begin(), known.end(), d) != known.end(),
                  "AppConfig.datasets names an unknown dataset '", d, "'");
  }
  MINIDL_ASSERT(std::find(c.datasets.begin(), c.datasets.end(), c.dataset) != c.datasets.end(),
                "AppConfig.dataset '", c.dataset, "' is not one of AppConfig.datasets");
  // Not in --help (CLI11 would end it with an empty line for a hidden option): the flag
  // reference in Markdown with this program's defaults, for scripts/flags-doc.
  if (argc == 2 && std::string_view(argv[1]) == "--help-markdown") {
    if (parallel::world().rank() == 0) fmt::print("{}", flags_markdown(c, hooks.flags));
    return 0;
  }
  CLI::App app(description, program);
  add_flags(app, c);
  for (const AppFlag& f : hooks.flags) {  // the example's own
    CLI::Option* o = app.add_option(f.name, *f.value, f.help)->capture_default_str();
    if (f.check) o->check(CLI::Validator([&f](std::string& v) { return f.check(v); }, ""));
  }
  // A rank's flag error, like any error before training, goes through the preflight, which
  // ends every rank with it (rank 0 reports it), so no rank waits for one that stopped. Later
  // errors may be one rank's own: each rank reports its error and the job ends at once, so no
  // rank waits for a collective that will never come.
  parallel::Communicator& comm = parallel::world();
  const bool root = comm.rank() == 0;
  // Every exception ends here as one line: minidl::Error says what is wrong itself; anything
  // else (a library's exception) is named with what the run was doing.
  std::string error;
  std::string doing = "reading the flags";
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      // Every rank must have asked for it, else the others would wait in preflight.
      parallel::preflight(comm, "--help");
      return root ? app.exit(e) : 0;
    } catch (const CLI::ParseError& e) {
      parallel::preflight(comm, {}, e.what(), 2);
    } catch (const std::exception& e) {  // from an example's own check of its flags
      parallel::preflight(comm, {}, "reading the flags: " + printable(e.what(), 1000), 2);
    }
    return run_training(program, c, build, hooks, doing);
  } catch (const parallel::PreflightError& e) {
    // Every rank stopped in the preflight with the same error: one report, a normal exit.
    if (root) fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return e.exit_code();
  } catch (...) {
    error = current_error(doing);
  }
  if (comm.size() == 1) {
    fmt::print(stderr, "{}: error: {}\n", program, error);
    return 1;
  }
  fmt::print(stderr, "{}: error on rank {}: {}\n", program, comm.rank(), error);
  std::fflush(stderr);
  comm.abort(1);
  return 1;  // not reached: abort ends the job
}

}  // namespace minidl
