#include "minidl/frontend/app.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
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

#include "minidl/core/threading.hpp"
#include "minidl/frontend/checkpoint_shared.hpp"
#include "minidl/frontend/progress.hpp"
#include "minidl/frontend/trace.hpp"
#include "minidl/frontend/trainer.hpp"
#include "minidl/io/file.hpp"
#include "minidl/ir/printer.hpp"
#include "minidl/parallel/communicator.hpp"
#include "minidl/train/loss.hpp"
#include "minidl/train/optimizer.hpp"

namespace minidl {

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

/// Appends JSON lines to a file that is written whole at each epoch: a temporary file renamed
/// over the target, so a reader never sees a half-written line.
class MetricsWriter {
 public:
  explicit MetricsWriter(std::string path) : path_(std::move(path)) {
    if (!path_.empty()) flush();  // fail early on an unwritable path
  }
  void add(const nlohmann::json& record) {
    if (path_.empty()) return;
    text_ += record.dump() + "\n";
    flush();
  }

 private:
  void flush() { write_file_atomically(path_, text_, "--metrics"); }
  std::string path_;
  std::string text_;
};

/// Writes the graph to path (--dump-graph), as DOT when it ends in ".dot", else as text.
void write_graph(const ir::Graph& g, const std::string& path) {
  const std::string text = path.ends_with(".dot") ? ir::to_dot(g) : ir::to_text(g);
  write_file_atomically(path, text, "graph dump");
}

/// The values --backend accepts: onednn only in builds with oneDNN.
std::vector<std::string> backends() {
  std::vector<std::string> b{"native"};
  if (MINIDL_WITH_ONEDNN) b.emplace_back("onednn");
  return b;
}

/// The --profile table: kernel time per node over all training steps, largest first. With
/// several ranks, the time is rank 0's and min/max give the spread over the ranks (every rank
/// runs the same nodes: preflight checked the graphs). Collective.
void print_kernel_times(parallel::Communicator& comm, std::vector<Trainer::KernelTime> rows,
                        bool print) {
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
  fmt::print("\nkernel time per node (training steps, {:.3f} s in kernels on rank 0{}):\n", total,
             spread ? fmt::format("; min/max over {} ranks", ranks) : std::string());
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

/// More OpenMP threads on this machine than cores, with threads that spin when idle (OpenMP's
/// default), make every parallel region wait for preempted threads: say how to avoid it.
void warn_if_spinning_oversubscribed(const std::string& program) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
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

/// The settings a checkpoint records and a resuming run is checked against.
std::vector<checkpoint::Setting> run_settings(const AppConfig& c, const nn::Module& model,
                                              const Dataset& train_set, int ranks) {
  using R = checkpoint::Rule;
  const auto str = [](const auto& v) { return fmt::format("{}", v); };
  return {{"model", model.describe(), R::Same, "the model"},
          {"dataset", c.dataset, R::SameMidEpoch, "--dataset"},
          {"train_samples", str(train_set.size()), R::SameMidEpoch,
           "the training set size (--train-limit)"},
          {"upscale", str(c.upscale), R::SameMidEpoch, "--upscale"},
          {"batch_size", str(c.batch_size), R::SameMidEpoch, "--batch-size"},
          {"seed", str(c.seed), R::SameMidEpoch, "--seed"},
          {"shuffle", str(!c.no_shuffle), R::SameMidEpoch, "shuffling (--no-shuffle)"},
          {"lr", str(c.lr), R::Note, "--lr"},
          {"optimizer", c.optimizer, R::Same, "--optimizer"},
          {"momentum", str(c.momentum), R::Note, "--momentum"},
          {"nesterov", str(c.nesterov), R::Note, "--nesterov"},
          {"weight_decay", str(c.weight_decay), R::Note, "--weight-decay"},
          {"betas", fmt::format("{},{}", c.beta1, c.beta2), R::Note, "--beta1/--beta2"},
          {"eps", str(c.eps), R::Note, "--eps"},
          {"lr_schedule",
           fmt::format("{} step_epochs={} gamma={} warmup={} epochs={}", c.lr_schedule,
                       c.lr_step_epochs, c.lr_gamma, c.warmup_steps, c.epochs),
           R::Note, "--lr-schedule, --lr-step-epochs, --lr-gamma, --warmup-steps, --epochs"},
          {"clip_grad_norm", str(c.clip_grad_norm), R::Note, "--clip-grad-norm"},
          {"loss", fmt::format("{} label_smoothing={}", c.loss, c.label_smoothing), R::Note,
           "--loss, --label-smoothing"},
          {"ranks", str(ranks), R::Note, "the number of ranks"},
          {"threads", str(max_threads()), R::Note, "the number of threads (--threads)"},
          {"thread_mode", c.thread_mode, R::Note, "--thread-mode"},
          {"backend", c.backend, R::Note, "--backend"},
          {"reduce", c.reduce, R::Note, "--reduce"},
          {"bucket_mb", str(c.bucket_mb), R::Note, "--bucket-mb"},
          {"overlap", str(c.overlap), R::Note, "--overlap"},
          {"fuse", str(!c.no_fuse), R::Note, "fusion (--no-fuse)"},
          {"deterministic", str(c.deterministic), R::Note, "--deterministic"},
          {"micro_batch", str(c.deterministic ? c.micro_batch : 0), R::Note, "--micro-batch"}};
}

/// What a checkpoint of this model and optimizer holds.
checkpoint::Tensors checkpoint_tensors(nn::Module& model, const optim::Optimizer& optimizer) {
  return {model.parameters(), model.buffers(), optimizer.state()};
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

int run_training(const std::string& program, AppConfig& c, const ModelBuilder& build,
                 const AppHooks& hooks) {
  if (c.threads > 0) set_num_threads(c.threads);
  parallel::Communicator& comm = parallel::world();
  // Before the first collective (the parameters' broadcast below, the preflight).
  comm.set_timeout(c.collective_timeout);
  const bool root = comm.rank() == 0;
  const std::string dir = c.data.empty() ? "data/" + c.dataset : c.data;
  auto [train_set, test_set] = [&] {
    const DatasetSplits all = load_dataset(c.dataset, dir);
    return DatasetSplits{take(all.train, c.train_limit), take(all.test, c.test_limit)};
  }();
  train_set = upscale(train_set, c.upscale);
  test_set = upscale(test_set, c.upscale);
  if (c.normalize) {
    const ChannelStats stats = channel_stats(train_set);
    normalize_channels(train_set, stats);
    normalize_channels(test_set, stats);
  }

  const auto& dims = train_set.images.shape().dims();
  const Shape sample(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
  std::unique_ptr<nn::Module> model = build(c, sample);
  model->reset(c.seed);
  if (!c.init.empty()) nn::load_state_dict(*model, c.init);
  // Every rank starts from rank 0's parameters and buffers (they agree already when seeds agree;
  // this makes it so whatever the initialisation).
  for (auto& [name, t] : model->state_dict()) comm.broadcast(t.raw(), t.nbytes(), 0);
  std::unique_ptr<optim::Optimizer> optimizer;
  if (c.optimizer == "adamw") {
    optimizer = std::make_unique<optim::AdamW>(optim::AdamWOptions{.lr = c.lr,
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
  const std::unique_ptr<train::Loss> loss = train::make_loss(c.loss, c.label_smoothing);
  const std::int64_t steps_per_epoch = std::max<std::int64_t>(
      1, Trainer::steps_per_epoch(train_set.size(), c.batch_size, comm.size()));
  const optim::LrSchedule schedule(c.lr,
                                   {.kind = optim::parse_schedule(c.lr_schedule),
                                    .step_epochs = c.lr_step_epochs,
                                    .gamma = c.lr_gamma,
                                    .warmup_steps = c.warmup_steps},
                                   steps_per_epoch, steps_per_epoch * c.epochs);
  TrainerOptions topt;
  topt.batch_size = c.batch_size;
  topt.seed = c.seed;
  topt.shuffle = !c.no_shuffle;
  topt.compile.backend = c.backend == "onednn" ? ir::Backend::OneDnn : ir::Backend::Native;
  topt.compile.profile = c.profile;
  topt.compile.trace = !c.trace.empty();
  topt.compile.check_numerics = c.check_numerics;
  topt.fuse = !c.no_fuse;
  topt.replicas = c.thread_mode == "replicas" ? max_threads() : 1;
  topt.reduce_strategy = parallel::parse_reduce_strategy(c.reduce);
  topt.bucket_bytes = static_cast<std::int64_t>(c.bucket_mb * 1024 * 1024);
  topt.overlap = c.overlap;
  topt.micro_batch = c.deterministic ? c.micro_batch : 0;
  topt.clip_grad_norm = c.clip_grad_norm;
  topt.loss = loss.get();
  topt.targets = c.reconstruct ? TrainerOptions::Targets::Inputs : TrainerOptions::Targets::Labels;
  topt.schedule = &schedule;
  Trainer trainer(*model, *optimizer, topt);
  if (!c.dump_graph.empty() && root) {
    write_graph(trainer.training_graph(sample), c.dump_graph);
  }
  const bool talk = root && !c.quiet;  // headers, per-epoch lines, notes
  if (talk) warn_if_spinning_oversubscribed(program);
  const std::int64_t kill_after = test_hook("MINIDL_TEST_KILL_AFTER_STEP", 0, 1);
  const std::int64_t kill_only = test_hook("MINIDL_TEST_KILL_RANK", -1, 0);
  const std::int64_t stall_after = test_hook("MINIDL_TEST_STALL_AFTER_STEP", 0, 1);
  const std::int64_t stall_rank = test_hook("MINIDL_TEST_STALL_RANK", 0, 0);
  const std::int64_t nan_after = test_hook("MINIDL_TEST_NAN_AFTER_STEP", 0, 1);
  if (!c.checkpoint_dir.empty() && c.checkpoint_every == 0 && c.checkpoint_every_steps == 0)
    c.checkpoint_every = 1;
  const std::vector<checkpoint::Setting> settings = run_settings(c, *model, train_set, comm.size());

  int first_epoch = 1;
  std::int64_t first_sample = 0, first_epoch_step = 0;
  std::string resumed, resumed_from;  // what to say about it after the header; the file
  if (!c.resume.empty()) {
    const checkpoint::Loaded ckpt =
        checkpoint::load_shared(comm, c.resume, checkpoint_tensors(*model, *optimizer));
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

  if (!c.checkpoint_dir.empty() && root) {
    std::error_code ec;
    std::filesystem::create_directories(c.checkpoint_dir, ec);
    MINIDL_CHECK(!ec, "--checkpoint-dir: cannot create '", c.checkpoint_dir, "': ", ec.message());
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
  std::int64_t n_params = 0;
  for (const auto& [name, t] : model->parameters()) n_params += t.numel();
  metrics.add({{"config",
                {{"program", program},
                 {"model", model->describe()},
                 {"parameters", n_params},
                 {"dataset", c.dataset},
                 {"train_samples", train_set.size()},
                 {"test_samples", test_set.size()},
                 {"normalize", c.normalize},
                 {"upscale", c.upscale},
                 {"ranks", comm.size()},
                 {"threads", max_threads()},
                 {"thread_mode", c.deterministic ? "deterministic" : c.thread_mode},
                 {"deterministic", c.deterministic},
                 {"micro_batch", c.deterministic ? c.micro_batch : 0},
                 {"backend", c.backend},
                 {"reduce", c.reduce},
                 {"bucket_mb", c.bucket_mb},
                 {"overlap", c.overlap},
                 {"fuse", !c.no_fuse},
                 {"batch_size", c.batch_size},
                 {"lr", c.lr},
                 {"optimizer", optimizer->describe()},
                 {"momentum", c.momentum},
                 {"nesterov", c.nesterov},
                 {"weight_decay", c.weight_decay},
                 {"lr_schedule", schedule.describe()},
                 {"clip_grad_norm", c.clip_grad_norm},
                 {"loss", c.loss},
                 {"label_smoothing", c.label_smoothing},
                 {"seed", c.seed},
                 {"shuffle", !c.no_shuffle},
                 {"epochs", c.epochs},
                 {"resume", resumed_from.empty() ? nlohmann::json() : nlohmann::json(resumed_from)},
                 {"first_epoch", first_epoch}}}});

  if (talk) {
    fmt::print(
        "{}: {} on {}{} ({} train, {} test samples), {} parameters, {} rank(s) x {} "
        "thread(s) ({}), {} kernels\n",
        program, model->describe(), c.dataset, c.normalize ? " (normalised per channel)" : "",
        train_set.size(), test_set.size(), n_params, comm.size(), max_threads(),
        c.deterministic ? fmt::format("deterministic, micro-batch {}", c.micro_batch)
                        : c.thread_mode,
        c.backend);
    fmt::print("{}", resumed);
    std::fflush(stdout);
  }
  Progress progress(root ? progress_mode(stdout, c.quiet) : ProgressMode::Quiet, c.epochs);
  // Every rank takes part (the position's statistics are reduced); rank 0 writes, and the
  // others wait until the file is in place.
  auto save_checkpoint = [&] {
    const TrainerPosition pos = trainer.position();
    if (root) {
      const std::string path =
          checkpoint::save(c.checkpoint_dir, pos, checkpoint_tensors(*model, *optimizer),
                           checkpoint::settings_metadata(settings), c.checkpoint_keep);
      if (talk) {
        progress.clear();
        fmt::print("           checkpoint {}\n", path);
        std::fflush(stdout);
      }
    }
    comm.barrier();
  };
  bool stopped = false;  // --max-steps reached
  auto on_step = [&](const StepInfo& info) {
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
      std::this_thread::sleep_for(std::chrono::minutes(10));
    if (nan_after > 0 && info.step == nan_after) {
      // The last parameter (the output layer's bias in the examples): no ReLU after it would
      // turn the NaN into 0. A Tensor is a handle: the copy writes the parameter's storage.
      const Tensor t = model->parameters().back().second;
      t.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    }
  };
  EvalStats last{};
  bool evaluated = false;
  for (int epoch = first_epoch; epoch <= c.epochs; ++epoch) {
    progress.start_epoch(epoch, train_set.size(), epoch == first_epoch ? first_sample : 0);
    const EpochStats s = trainer.train_epoch(train_set, epoch, on_step);
    const EvalStats e = trainer.evaluate(test_set);
    last = e;
    evaluated = true;
    const double sps = static_cast<double>(s.timed_samples) / s.seconds;
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
        fmt::print("           compute {:.3f} s  communication {:.3f} s  waiting {:.3f} s\n",
                   s.seconds - s.comm_seconds - s.wait_seconds, s.comm_seconds, s.wait_seconds);
      }
      std::fflush(stdout);
    }
    nlohmann::json record = {{"epoch", epoch},
                             {"train_loss", s.loss},
                             {"test_loss", e.loss},
                             {"epoch_seconds", s.seconds},
                             {"samples_per_second", sps},
                             {"comm_seconds", s.comm_seconds},
                             {"wait_seconds", s.wait_seconds},
                             {"lr", s.lr}};
    if (loss->classification()) {
      record["train_accuracy"] = s.accuracy;
      record["test_accuracy"] = e.accuracy;
    }
    if (c.clip_grad_norm > 0) record["grad_norm"] = s.grad_norm;
    metrics.add(record);
    if (c.checkpoint_every > 0 && epoch % c.checkpoint_every == 0 && !stopped) save_checkpoint();
    if (stopped) break;
  }
  if (c.quiet) {
    if (!evaluated) last = trainer.evaluate(test_set);
    if (root) {
      if (loss->classification()) {
        fmt::print("{}: {} epoch(s)  test loss {:.4f}  test acc {:.2f}%\n", program, c.epochs,
                   last.loss, 100.0 * last.accuracy);
      } else {
        fmt::print("{}: {} epoch(s)  test loss {:.6f}\n", program, c.epochs, last.loss);
      }
      std::fflush(stdout);
    }
  }
  if (c.profile) print_kernel_times(comm, trainer.kernel_times(), talk);
  if (!c.trace.empty()) {
    const std::size_t events = write_chrome_trace(c.trace, comm, trainer.trace_spans());
    if (talk) fmt::print("{}: wrote {} ({} kernel calls)\n", program, c.trace, events);
  }
  if (!c.save.empty() && root) {
    nn::save_state_dict(*model, c.save);
  }
  if (hooks.after_training && root) hooks.after_training(c, *model, test_set);
  return 0;
}

}  // namespace

int run_training_app(int argc, char** argv, const std::string& description, AppConfig c,
                     const ModelBuilder& build, const AppHooks& hooks) {
  const std::string program = std::filesystem::path(argv[0]).filename().string();
  // The example's own choice of datasets: a mistake here is the program's, not the user's.
  const std::vector<std::string> known = dataset_names();
  for (const std::string& d : c.datasets) {
    MINIDL_ASSERT(std::find(known.begin(), known.end(), d) != known.end(),
                  "AppConfig.datasets names an unknown dataset '", d, "'");
  }
  MINIDL_ASSERT(std::find(c.datasets.begin(), c.datasets.end(), c.dataset) != c.datasets.end(),
                "AppConfig.dataset '", c.dataset, "' is not one of AppConfig.datasets");
  CLI::App app(description, program);
  app.add_option("--data", c.data, "dataset directory (default: data/<dataset>)");
  app.add_option("--dataset", c.dataset, "dataset")
      ->check(CLI::IsMember(c.datasets))
      ->capture_default_str();
  app.add_option("--hidden", c.hidden, "hidden layer sizes, comma-separated; \"\" for none")
      ->capture_default_str();
  app.add_option("--activation", c.activation, "hidden activation")
      ->check(CLI::IsMember({"relu", "sigmoid", "tanh"}))
      ->capture_default_str();
  app.add_option("--epochs", c.epochs, "epochs")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch-size", c.batch_size, "batch size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--lr", c.lr, "learning rate")
      ->check(CLI::Range(1e-12, 1e6))
      ->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum in [0, 1)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "optimizer")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_flag("--nesterov", c.nesterov, "Nesterov momentum (SGD, needs --momentum)");
  app.add_option("--weight-decay", c.weight_decay,
                 "weight decay: added to the gradient (SGD) or decoupled (AdamW)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--beta1", c.beta1, "AdamW's first-moment decay in [0, 1)")
      ->check(CLI::Range(0.0, 0.999999999))
      ->capture_default_str();
  app.add_option("--beta2", c.beta2, "AdamW's second-moment decay in [0, 1)")
      ->check(CLI::Range(0.0, 0.999999999))
      ->capture_default_str();
  app.add_option("--eps", c.eps, "AdamW's denominator term")
      ->check(CLI::Range(1e-30, 1.0))
      ->capture_default_str();
  app.add_option("--lr-schedule", c.lr_schedule,
                 "learning rate per step: constant, step (x gamma every --lr-step-epochs) or "
                 "cosine (to 0 at the last step)")
      ->check(CLI::IsMember({"constant", "step", "cosine"}))
      ->capture_default_str();
  app.add_option("--lr-step-epochs", c.lr_step_epochs, "the step schedule's period in epochs")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--lr-gamma", c.lr_gamma, "the step schedule's factor")
      ->check(CLI::Range(1e-12, 1e6))
      ->capture_default_str();
  app.add_option("--warmup-steps", c.warmup_steps,
                 "linear warm-up over the first N steps (any schedule)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--clip-grad-norm", c.clip_grad_norm,
                 "clip the global gradient norm to X after the reduction (0: off)")
      ->check(CLI::Range(0.0, 1e12))
      ->capture_default_str();
  if (c.losses.size() > 1) {
    app.add_option("--loss", c.loss, "loss")->check(CLI::IsMember(c.losses))->capture_default_str();
  }
  if (std::find(c.losses.begin(), c.losses.end(), "cross-entropy") != c.losses.end()) {
    app.add_option("--label-smoothing", c.label_smoothing,
                   "cross-entropy's label smoothing in [0, 1]")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
  }
  app.add_option("--max-steps", c.max_steps,
                 "stop after N training steps, then evaluate and save (0: train every epoch)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--seed", c.seed, "random seed (initialisation and shuffling)")
      ->capture_default_str();
  app.add_option("--threads", c.threads, "OpenMP threads (0: OMP_NUM_THREADS or all cores)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--backend", c.backend,
                 "preferred kernels; ops that the backend lacks fall back to native")
      ->check(CLI::IsMember(backends()))
      ->capture_default_str();
  app.add_option("--train-limit", c.train_limit, "use the first N training samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--test-limit", c.test_limit, "use the first N test samples (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics", c.metrics,
                 "write JSON lines to FILE: {\"config\": {...}} with the run's settings, then "
                 "one record per epoch");
  app.add_option("--save", c.save, "save the trained parameters to FILE.safetensors");
  CLI::Option* init =
      app.add_option("--init", c.init, "start from the parameters in FILE.safetensors");
  app.add_option("--dump-graph", c.dump_graph, "write the training graph to FILE (.dot or .txt)");
  app.add_flag("--no-shuffle", c.no_shuffle, "keep the data in file order every epoch");
  app.add_flag("--quiet", c.quiet,
               "print nothing but errors and one final line (test loss and accuracy)");
  CLI::Option* ckpt_dir = app.add_option(
      "--checkpoint-dir", c.checkpoint_dir,
      "write checkpoints (parameters, optimizer state, position) to DIR, every epoch unless "
      "--checkpoint-every or --checkpoint-every-steps says otherwise");
  app.add_option("--checkpoint-every", c.checkpoint_every, "checkpoint every N epochs")
      ->check(CLI::Range(1, 100000))
      ->needs(ckpt_dir);
  app.add_option("--checkpoint-every-steps", c.checkpoint_every_steps,
                 "checkpoint every N training steps")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->needs(ckpt_dir);
  app.add_option("--checkpoint-keep", c.checkpoint_keep, "keep the newest K checkpoints")
      ->check(CLI::Range(1, 1000000))
      ->needs(ckpt_dir)
      ->capture_default_str();
  app.add_option("--resume", c.resume,
                 "continue from a checkpoint FILE, or from the newest checkpoint in a directory")
      ->excludes(init);
  CLI::Option* deterministic = app.add_flag(
      "--deterministic", c.deterministic,
      "bitwise the same parameters for any ranks x threads: micro-shards summed in one fixed "
      "tree order");
  app.add_option("--micro-batch", c.micro_batch,
                 "samples per micro-shard in deterministic mode; must divide --batch-size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->needs(deterministic)
      ->capture_default_str();
  app.add_option("--thread-mode", c.thread_mode,
                 "use of each rank's threads: data-parallel replicas or parallel kernels")
      ->check(CLI::IsMember({"replicas", "intra-op"}))
      ->excludes(deterministic)
      ->capture_default_str();
  app.add_option("--reduce", c.reduce, "gradient reduction across ranks")
      ->check(CLI::IsMember({"allreduce", "root", "hierarchical"}))
      ->excludes(deterministic)
      ->capture_default_str();
  app.add_option("--bucket-mb", c.bucket_mb,
                 "gradient bucket size in MiB (0: one reduction per gradient)")
      ->check(CLI::Range(0.0, 1024.0))
      ->capture_default_str();
  app.add_flag("--overlap", c.overlap,
               "start each gradient bucket's reduction during the backward (non-blocking)")
      ->excludes(deterministic);
  app.add_flag("--no-fuse", c.no_fuse,
               "do not fold bias_add and relu into matmul/conv2d, nor SGD updates into their "
               "gradient products");
  app.add_option("--upscale", c.upscale,
                 "enlarge every image K times per side (more work per sample)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_flag("--profile", c.profile,
               "time every kernel: per-epoch compute/communication/waiting split and a per-node "
               "table at the end");
  app.add_flag("--check-numerics", c.check_numerics,
               "check every node's output for NaN and Inf and name the first node that produced "
               "one (the loss is checked every step regardless)");
  app.add_option("--collective-timeout", c.collective_timeout,
                 "seconds a collective may wait for the other ranks before the job ends with an "
                 "error naming it and the ranks that did not arrive (0: no limit)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--trace", c.trace,
                 "write every kernel call of the training steps to FILE.json (Chrome trace: "
                 "Perfetto, chrome://tracing), one track per rank and thread");
  for (const AppFlag& f : hooks.flags) {  // the example's own
    CLI::Option* o = app.add_option(f.name, *f.value, f.help)->capture_default_str();
    if (f.check) o->check(CLI::Validator([&f](std::string& v) { return f.check(v); }, ""));
  }
  // Flags are the same on every rank, so only rank 0 reports their errors. Other errors may be
  // one rank's own: each rank reports its error and the job ends at once, so no rank waits
  // for a collective that will never come.
  parallel::Communicator& comm = parallel::world();
  const bool root = comm.rank() == 0;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return root ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    if (root) fmt::print(stderr, "{}: error: {}\n", program, e.what());
    return 2;
  }
  std::string error;
  try {
    (void)c.hidden_sizes();
    return run_training(program, c, build, hooks);
  } catch (const Error& e) {
    error = e.what();
  } catch (const std::bad_alloc&) {
    error = "out of memory";
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
