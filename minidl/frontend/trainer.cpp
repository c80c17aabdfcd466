#include "minidl/frontend/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "minidl/core/clock.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/parallel/preflight.hpp"
#include "minidl/train/batch.hpp"
#include "minidl/train/tensor_parallel.hpp"

namespace minidl {

namespace {

train::StepOptions step_options(const TrainerOptions& o, parallel::Communicator& comm) {
  return {.layout = parallel::Layout({.ranks = comm.size(),
                                      .replicas = o.replicas,
                                      .micro_batch = o.micro_batch,
                                      .accumulate = o.accumulate,
                                      .shards = o.tensor_comm ? o.tensor_comm->size() : 1}),
          .comm = &comm,
          .compile = o.compile,
          .fuse = o.fuse,
          .reduce = o.reduce_strategy,
          .bucket_bytes = o.bucket_bytes,
          .overlap = o.overlap,
          .clip_grad_norm = o.clip_grad_norm,
          .sync_batch_stats = o.sync_batch_stats,
          .zero = o.zero,
          .tensor_comm = o.tensor_comm};
}

Shape sample_shape(const Dataset& d) {
  const auto& dims = d.images.shape().dims();
  return Shape(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A thread of its own running one job at a time: the next training batch, prepared while a step
// runs. A std::thread, not OpenMP: the step's OpenMP threads are running the kernels, and the
// job uses no OpenMP and no MPI (the communicator is the main thread's). A job's exception is
// kept and rethrown by wait() on the main thread; the destructor lets a running job finish,
// drops its result, and joins, so an error elsewhere never leaves the thread running.
class PrefetchThread {
 public:
  PrefetchThread() : thread_([this] { loop(); }) {}
  PrefetchThread(const PrefetchThread&) = delete;
  PrefetchThread& operator=(const PrefetchThread&) = delete;
  ~PrefetchThread() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
      wake_.notify_all();
    }
    thread_.join();
  }

  /// Starts job; the previous one must have been waited for.
  void start(std::function<void()> job) {
    std::lock_guard lock(mutex_);
    MINIDL_ASSERT(done_ && !job_, "prefetch: a job started before the last one was waited for");
    job_ = std::move(job);
    done_ = false;
    wake_.notify_all();
  }

  /// Waits for the job started last (at once if none); rethrows what it threw.
  void wait() {
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return quit_ || job_; });
      if (quit_) return;
      const std::function<void()> job = std::exchange(job_, nullptr);
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      finished_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool done_ = true;
  bool quit_ = false;
  std::thread thread_;  // last: started once the members it reads exist
};

}  // namespace

Trainer::Trainer(train::Model& model, optim::Optimizer& optimizer, TrainerOptions options)
    : model_(model),
      optimizer_(optimizer),
      options_(options),
      comm_(options.comm ? *options.comm : parallel::world()),
      step_options_(step_options(options, comm_)) {
  MINIDL_CHECK(options.batch_size >= 1, "batch size must be at least 1, got ", options.batch_size);
  if (options.pipeline_stages > 1) {
    // Ranks are stages x data-parallel replicas, stage-major: stage s holds ranks
    // [s * D, (s + 1) * D), whose gradients are reduced among themselves only.
    const int stages = options.pipeline_stages;
    MINIDL_CHECK(comm_.size() % stages == 0, "--pipeline-stages ", stages, " with ", comm_.size(),
                 " rank(s): the ranks must be a multiple of the stages (each stage gets ranks / "
                 "stages data-parallel replicas)");
    const int replicas = comm_.size() / stages;
    parallel::Communicator* stage_comm = nullptr;
    if (replicas == 1) {
      stage_comm_ = parallel::make_local_communicator();
      stage_comm = stage_comm_.get();
    } else {
      // The split into groups of consecutive ranks is the stages' (collective).
      stage_comm = comm_.split_shared(replicas).node;
    }
    step_options_.comm = stage_comm;
    step_options_.layout = parallel::Layout({.ranks = replicas,
                                             .replicas = options.replicas,
                                             .micro_batch = options.micro_batch,
                                             .accumulate = options.accumulate});
    step_options_.pipeline = {.stages = stages,
                              .stage = comm_.rank() / replicas,
                              .comm = &comm_,
                              .schedule = options.pipeline_schedule,
                              .boundaries = options.pipeline_boundaries,
                              .balance = options.pipeline_balance};
  }
  MINIDL_CHECK(options.micro_batch == 0 || options.batch_size % options.micro_batch == 0,
               "deterministic mode: the micro-batch ", options.micro_batch,
               " does not divide the batch size ", options.batch_size);
  layout().check_batch(options.batch_size,
                       options.accumulate > 1 ? "a micro-step (--batch-size)" : "a batch");
  MINIDL_CHECK(options.eval_batch_size >= 1, "evaluation batch size must be at least 1, got ",
               options.eval_batch_size);
  if (options.loss == nullptr) own_loss_ = std::make_unique<train::CrossEntropy>();
  loss_ = options.loss ? options.loss : own_loss_.get();
  train::check_names(model_);
  MINIDL_CHECK(options.zero >= 0 && options.zero <= 2, "--zero ", options.zero,
               " (expected 0: off, 1: optimizer state sharded, 2: gradients too)");
  if (options.zero > 0) {
    MINIDL_CHECK(
        options.micro_batch > 0 || options.reduce_strategy == parallel::ReduceStrategy::Allreduce,
        "--zero reduces the gradients its own way (reduce-scatter): --reduce ",
        parallel::reduce_strategy_name(options.reduce_strategy), " does not apply");
    MINIDL_CHECK(options.micro_batch > 0 || !options.overlap,
                 "--zero reduces the gradients after the backward: --overlap does not apply");
  }
  // The optimizer's state exists before any graph is built, so a checkpoint can fill it; with
  // ZeRO only for the pieces of the parameters in this rank's shard.
  if (options.zero > 0)
    optimizer_.init_state(
        train::zero_state_shapes(train::zero_plan(model_, comm_.size()), comm_.rank()));
  else
    optimizer_.init_state(model_.parameters());
}

NamedTensors Trainer::optimizer_state() {
  if (options_.tensor_comm != nullptr)
    return train::whole_state(optimizer_.state(), model_, *options_.tensor_comm);
  if (options_.zero == 0) return optimizer_.state();
  const parallel::ZeroPlan plan = train::zero_plan(model_, comm_.size());
  const NamedTensors own = optimizer_.state();
  auto find = [&](const std::string& key) -> const Tensor* {
    for (const auto& [name, t] : own)
      if (name == key) return &t;
    return nullptr;
  };
  NamedTensors out;
  std::vector<float> pieces;
  for (std::size_t i = 0; i < plan.names.size(); ++i) {
    std::vector<std::int64_t> bytes;
    for (int r = 0; r < comm_.size(); ++r)
      bytes.push_back(plan.piece(i, r).size() * static_cast<std::int64_t>(sizeof(float)));
    for (const std::string& kind : optimizer_.state_kinds()) {
      const std::string key = plan.names[i] + "." + kind;
      Tensor full = Tensor::zeros(plan.shapes[i]);
      const Tensor* mine = find(key);
      MINIDL_CHECK(mine != nullptr || plan.piece(i, comm_.rank()).size() == 0,
                   "--zero: the optimizer has no state '", key, "' for this rank's piece");
      const void* in = mine ? mine->raw() : full.raw();
      comm_.allgatherv(in, full.raw(), bytes);
      out.emplace_back(key, full);
    }
  }
  return out;
}

void Trainer::gather_stages() {
  if (options_.pipeline_stages <= 1) return;
  // Which rank updates each parameter and buffer (BatchNorm's running statistics): the one whose
  // training program uses it.
  std::set<std::string> mine;
  for (const auto& [key, program] : programs_) {
    if (!std::get<0>(key) || std::get<3>(key) >= 0) continue;
    for (const ir::Graph* g : program->graphs())
      for (const ir::Node* n : g->nodes())
        if ((n->op() == "parameter" || n->op() == "state") && !n->output()->users().empty())
          mine.insert(n->name());
  }
  // Parameters then buffers (the state_dict), each sent from the rank that updates it.
  NamedTensors params = model_.parameters();
  for (auto& b : model_.buffers()) params.push_back(std::move(b));
  // held[i * ranks + r]: rank r updates tensor i (every replica of its stage does).
  const auto ranks = static_cast<std::size_t>(comm_.size());
  std::vector<std::int64_t> held(params.size() * ranks, 0);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (mine.count(params[i].first)) held[i * ranks + static_cast<std::size_t>(comm_.rank())] = 1;
  comm_.allreduce_sum(held.data(), static_cast<std::int64_t>(held.size()));
  std::vector<std::int64_t> owner(params.size(), 0);  // the first such rank + 1; 0: none
  for (std::size_t i = 0; i < params.size(); ++i)
    for (std::size_t r = ranks; r-- > 0;)
      if (held[i * ranks + r] != 0) owner[i] = static_cast<std::int64_t>(r) + 1;
  const NamedTensors state = optimizer_.state();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (owner[i] == 0) continue;  // not trained yet
    const int from = static_cast<int>(owner[i] - 1);
    Tensor p = params[i].second;
    comm_.broadcast(p.raw(), static_cast<std::int64_t>(p.nbytes()), from);
    for (const auto& [key, t] : state) {
      if (key.rfind(params[i].first + ".", 0) != 0) continue;
      Tensor st = t;
      comm_.broadcast(st.raw(), static_cast<std::int64_t>(st.nbytes()), from);
    }
  }
}

void Trainer::set_optimizer_state(const NamedTensors& state) {
  if (options_.tensor_comm != nullptr) {
    train::load_state_pieces(optimizer_.state(), state, *options_.tensor_comm);
    return;
  }
  if (options_.zero == 0) {
    for (const auto& [key, t] : state) {
      for (const auto& [name, own] : optimizer_.state())
        if (name == key && own.raw() != t.raw()) Tensor(own).copy_from(t);
    }
    return;
  }
  const parallel::ZeroPlan plan = train::zero_plan(model_, comm_.size());
  for (const auto& [name, own] : optimizer_.state()) {
    const std::size_t dot = name.rfind('.');
    const int i = plan.index(name.substr(0, dot));
    MINIDL_CHECK(i >= 0, "--zero: optimizer state '", name, "' of no parameter");
    const parallel::Slice p = plan.piece(static_cast<std::size_t>(i), comm_.rank());
    const auto it =
        std::find_if(state.begin(), state.end(), [&](const auto& s) { return s.first == name; });
    MINIDL_CHECK(it != state.end(), "--zero: no optimizer state '", name, "' to load");
    std::memcpy(own.raw(), it->second.data<float>() + p.begin,
                static_cast<std::size_t>(p.size()) * sizeof(float));
  }
}

Trainer::~Trainer() = default;

std::int64_t Trainer::steps_per_epoch(std::int64_t samples, std::int64_t batch, int ranks) {
  const std::int64_t batches = (samples + batch - 1) / batch;
  const std::int64_t last = samples - (batches - 1) * batch;
  return batches - (last < ranks ? 1 : 0);
}

train::CompiledStep& Trainer::program(bool train, std::int64_t n, const Shape& sample,
                                      int as_rank) {
  auto& slot = programs_[std::make_tuple(train, n, sample.dims(), as_rank)];
  if (slot) return *slot;
  slot = std::make_unique<train::CompiledStep>(train::compile_step(
      model_, *loss_, train ? &optimizer_ : nullptr,
      {.sample = sample, .batch = n, .train = train, .as_rank = as_rank}, step_options_));
  // The targets the loss wants must be what the data gives.
  const train::TargetSpec& t = slot->target();
  const std::int64_t part = slot->parts()[0].end - slot->parts()[0].begin;
  if (options_.targets == TrainerOptions::Targets::Labels) {
    MINIDL_CHECK(t.dtype == DType::I32 && t.shape == Shape{part}, "loss '", loss_->name(),
                 "' wants ", t.dtype, " targets ", t.shape, " for ", part,
                 " samples, but the targets are the dataset's class labels (i32 [", part,
                 "]): use a classification loss, or the samples themselves as targets");
  } else {
    MINIDL_CHECK(t.dtype == DType::F32 && t.shape.numel() == part * sample.numel(), "loss '",
                 loss_->name(), "' wants ", t.dtype, " targets ", t.shape, " for ", part,
                 " samples, but the targets are the samples themselves (", sample,
                 " each): the model's output must have as many values per sample");
  }
  return *slot;
}

train::MemoryUse Trainer::memory(const Shape& sample) {
  return program(true, step_batch(), sample).memory();
}

const ir::Graph& Trainer::training_graph(const Shape& sample) {
  return program(true, step_batch(), sample).graph();
}

// Loss and correct predictions summed over this rank's samples, then over the ranks.
struct Trainer::Sums {
  double loss = 0.0;
  double correct = 0.0;
  double norm = 0.0;  // gradient norms summed over steps (the same on every rank)
  std::int64_t norms = 0;
  double flops = 0.0;  // of the training steps
  void reduce(parallel::Communicator& comm) {
    double v[3] = {loss, correct, flops};
    comm.allreduce_sum(v, 3);
    loss = v[0];
    correct = v[1];
    flops = v[2];
  }
};

void Trainer::step(train::CompiledStep& p, const std::function<void(std::size_t)>& fill,
                   const train::StepFeed& feed, Sums& sums) {
  p.run(feed, fill);
  sums.loss += p.loss_sum();
  if (p.classification()) sums.correct += static_cast<double>(p.correct());
  if (const std::optional<double> n = p.grad_norm()) {
    sums.norm += *n;
    ++sums.norms;
  }
}

void Trainer::check_ranks_agree(const Dataset& d) {
  if (preflight_done_ || comm_.size() == 1) return;
  const Shape sample = sample_shape(d);
  std::string description =
      fmt::format("data {} samples of {}\nbatch {}\nseed {}\nshuffle {}\nlayout {}\n", d.size(),
                  sample, step_batch(), options_.seed, options_.shuffle, layout().describe());
  if (options_.pipeline_stages > 1) {
    // Each stage's graph is its own: compare the schedules of all stages, which every rank
    // has checked (replayed together) when compiling.
    description += fmt::format("pipeline {} stages, schedule {}\n", options_.pipeline_stages,
                               options_.pipeline_schedule);
    // Compiling checks all stages' schedules (replayed together) on every rank.
    description += train::format_schedule(program(true, step_batch(), sample).pipeline_schedule());
    parallel::preflight(comm_, description);
    preflight_done_ = true;
    return;
  }
  // Ranks may own subtrees of different sizes (3 ranks: 4, 2 and 2 of 8 micro-shards), so their
  // graphs differ in the number of replicas: every rank compares rank 0's.
  // So do their shards with ZeRO.
  const int as = (layout().deterministic() || options_.zero > 0) && comm_.rank() != 0 ? 0 : -1;
  for (const ir::Graph* g : program(true, step_batch(), sample, as).graphs())
    description += parallel::fingerprint(*g);
  // Rank 0's program is not run here: only its description was needed.
  if (as >= 0) programs_.erase(std::make_tuple(true, step_batch(), sample.dims(), as));
  parallel::preflight(comm_, description);
  preflight_done_ = true;
}

EpochStats Trainer::train_epoch(const Dataset& d, int epoch, const StepCallback& on_step) {
  MINIDL_CHECK(d.size() > 0, "training set '", d.name, "' is empty");
  MINIDL_CHECK(!resume_ || resume_->epoch == epoch, "the trainer resumes in epoch ",
               resume_ ? resume_->epoch : 0, ", but was asked to train epoch ", epoch);
  const Shape sample = sample_shape(d);
  check_ranks_agree(d);
  const auto t0 = Clock::now();
  std::vector<std::int64_t> order;
  if (options_.shuffle) {
    order = permutation(d.size(), mix64(options_.seed * 0x9e3779b97f4a7c15ULL + epoch));
  } else {
    order.resize(d.size());
    std::iota(order.begin(), order.end(), 0);
  }
  EpochStats s;
  s.epoch = epoch;
  Sums sums;
  TrainerPosition& pos = position_;
  pos = TrainerPosition{.epoch = epoch, .step = steps_};
  if (resume_) {
    // The saved sums are over all ranks: rank 0 carries them, so the reduction below counts
    // them once.
    pos = *resume_;
    if (comm_.rank() != 0) pos.loss_sum = pos.correct = 0.0;
    sums.loss = pos.loss_sum;
    sums.correct = pos.correct;
    resume_.reset();
  }
  if (layout().deterministic()) {
    // The last, ragged batch must still give every rank a micro-shard: skipping it would make
    // the result depend on the rank count.
    const std::int64_t last = d.size() % step_batch();
    if (last != 0) layout().check_batch(last, "the last batch");
  }
  const std::int64_t resumed_samples = pos.samples;
  double run_loss = 0.0;
  std::int64_t run_samples = 0;
  // The samples of the batch at `start`; 0 past the end, and for a last batch smaller than the
  // number of ranks, which would leave a rank without samples: every rank skips it (each knows
  // n and the rank count), so no rank waits for another.
  auto batch_size_at = [&](std::int64_t start) -> std::int64_t {
    if (start >= d.size()) return 0;
    const std::int64_t n = std::min(step_batch(), d.size() - start);
    return n < comm_.size() ? 0 : n;
  };
  const Tensor& targets = options_.targets == TrainerOptions::Targets::Labels ? d.labels : d.images;
  train::check_augmentable(options_.augment, d.images, "the samples of '" + d.name + "'");
  const train::AugmentKey key{.seed = options_.seed, .epoch = epoch};
  // Preparing the batch of training step `number` (from the start of training): gathering this
  // rank's share and augmenting it, into the step's inputs (gather) or a staged batch.
  auto check_not_failing = [&](std::int64_t number) {
    MINIDL_CHECK(options_.fail_preparing_step != number, "preparing the batch of training step ",
                 number, " failed (TrainerOptions::fail_preparing_step, a testing hook)");
  };
  // With prefetch: the two staged batches (staged_), the one the running step copies from and
  // the one the prefetch thread fills, and the time each took to prepare (declared before the
  // thread, which writes it).
  std::array<double, 2> prepared_in = {0.0, 0.0};
  std::optional<PrefetchThread> prefetch;
  if (options_.prefetch) prefetch.emplace();
  auto start_preparing = [&](std::size_t slot, train::CompiledStep& p, std::int64_t start,
                             std::int64_t n, std::int64_t number) {
    staged_[slot].shape_for(p);
    const std::span<const std::int64_t> batch = std::span(order).subspan(start, n);
    prefetch->start([&, slot, batch, number] {
      const auto t = Clock::now();
      check_not_failing(number);
      staged_[slot].prepare(d.images, targets, batch, options_.augment, key);
      prepared_in[slot] = seconds_since(t);
    });
  };
  std::size_t current = 0;  // the staged batch of the step about to run
  if (prefetch && batch_size_at(pos.next_sample) > 0) {
    const std::int64_t n = batch_size_at(pos.next_sample);
    start_preparing(0, program(true, n, sample), pos.next_sample, n, steps_ + 1);
  }
  for (std::int64_t start = pos.next_sample; start < d.size(); start += step_batch()) {
    const std::int64_t n = batch_size_at(start);
    if (n == 0) break;
    train::CompiledStep& p = program(true, n, sample);
    // The next step's program, compiled now (a collective with several ranks: every rank
    // compiles it at the same point) so that its batch can be prepared during this step.
    const std::int64_t next = start + step_batch(), next_n = batch_size_at(next);
    train::CompiledStep* next_p = prefetch && next_n > 0 ? &program(true, next_n, sample) : nullptr;
    const train::StepFeed feed{
        .lr = options_.schedule ? options_.schedule->lr(steps_) : optimizer_.lr(), .step = steps_};
    ++steps_;
    const double before = sums.loss;
    try {
      if (prefetch) {
        const auto t = Clock::now();
        prefetch->wait();
        s.data_wait_seconds += seconds_since(t);
        s.data_prepare_seconds += prepared_in[current];
        if (next_p) start_preparing(1 - current, *next_p, next, next_n, steps_ + 1);
        const train::StagedBatch& mine = staged_[current];
        step(
            p,
            [&](std::size_t j) {
              const auto t = Clock::now();
              mine.feed(p, j);
              s.data_wait_seconds += seconds_since(t);
            },
            feed, sums);
        current = 1 - current;
      } else {
        const std::span<const std::int64_t> batch = std::span(order).subspan(start, n);
        step(
            p,
            [&](std::size_t j) {
              const auto t = Clock::now();
              check_not_failing(steps_);
              train::gather(p, d.images, targets, batch, j, options_.augment, key);
              const double took = seconds_since(t);
              s.data_wait_seconds += took;
              s.data_prepare_seconds += took;
            },
            feed, sums);
      }
    } catch (const Error& e) {
      MINIDL_FAIL("training step ", steps_, " (epoch ", epoch, ", step ", pos.epoch_step + 1,
                  " of the epoch): ", e.what());
    }
    s.lr = feed.lr;
    run_loss += sums.loss - before;
    for (std::size_t j = 0; j < p.micro_steps(); ++j) run_samples += p.share(j).size();
    pos.epoch_step += 1;
    pos.next_sample = start + n;
    pos.step = steps_;
    pos.samples += n;
    pos.loss_sum = sums.loss;
    pos.correct = sums.correct;
    if (on_step) {
      on_step(StepInfo{
          .epoch = epoch,
          .epoch_step = pos.epoch_step,
          .position = pos.next_sample,
          .epoch_size = d.size(),
          .step = steps_,
          .running_loss = run_samples ? run_loss / static_cast<double>(run_samples) : 0.0});
    }
    if (stop_) break;
  }
  // A batch prepared for a step that will not run (stopped) is dropped, with any error of its
  // preparation: the next call prepares it again.
  prefetch.reset();
  const bool stopped = stop_;
  stop_ = false;
  const std::int64_t samples = pos.samples;
  // Stopped inside the epoch, the position stays there (a checkpoint resumes from it).
  if (!stopped) position_ = TrainerPosition{.epoch = epoch + 1, .step = steps_};
  const double flops = training_flops();
  sums.flops = flops - flops_;
  flops_ = flops;
  sums.reduce(comm_);
  // With tensor parallelism comm_ holds this shard's replicas: the other shards' products too.
  if (options_.tensor_comm != nullptr) options_.tensor_comm->allreduce_sum(&sums.flops, 1);
  gather_stages();
  const auto [comm, wait] = comm_wait_seconds();
  s.comm_seconds = comm - comm_wait_.first;
  s.wait_seconds = wait - comm_wait_.second;
  comm_wait_ = {comm, wait};
  s.samples = samples;
  s.timed_samples = samples - resumed_samples;
  s.loss = sums.loss / static_cast<double>(samples);
  s.accuracy = loss_->classification() ? sums.correct / static_cast<double>(samples)
                                       : std::numeric_limits<double>::quiet_NaN();
  if (sums.norms > 0) s.grad_norm = sums.norm / static_cast<double>(sums.norms);
  s.flops = sums.flops;
  s.seconds = seconds_since(t0);
  return s;
}

TrainerPosition Trainer::position() {
  TrainerPosition p = position_;
  double v[2] = {p.loss_sum, p.correct};
  comm_.allreduce_sum(v, 2);
  p.loss_sum = v[0];
  p.correct = v[1];
  return p;
}

void Trainer::resume(const TrainerPosition& p) {
  MINIDL_CHECK(
      p.epoch >= 1 && p.epoch_step >= 0 && p.next_sample >= 0 && p.step >= 0 && p.samples >= 0,
      "cannot resume at an invalid position: epoch ", p.epoch, " (expected >= 1), step ",
      p.epoch_step, " of the epoch, sample ", p.next_sample, ", step ", p.step, " of training, ",
      p.samples, " samples (expected >= 0)");
  steps_ = p.step;
  position_ = p;
  if (comm_.rank() != 0) position_.loss_sum = position_.correct = 0.0;
  resume_ = p;
}

namespace {
// The profile's category of a node: what its op does to time, then its phase.
std::string category(const ir::Node& n) {
  if (n.def().comm_role() == ir::CommRole::Wait) return "wait";
  if (n.def().comm_role() == ir::CommRole::Collective || n.phase() == ir::Phase::Communication)
    return "communication";
  if (n.phase() == ir::Phase::Update) return "update";
  return "compute";
}
}  // namespace

std::vector<const runtime::Executable*> Trainer::training_executables() const {
  std::vector<const runtime::Executable*> out;
  for (const auto& [key, p] : programs_) {
    if (!std::get<0>(key) || std::get<3>(key) >= 0) continue;  // training programs this rank runs
    for (const runtime::Executable* exe : p->executables()) out.push_back(exe);
  }
  return out;
}

double Trainer::training_flops() const {
  double flops = 0.0;
  for (const runtime::Executable* exe : training_executables())
    flops += static_cast<double>(exe->flops_per_run()) * static_cast<double>(exe->counted_runs());
  return flops;
}

std::pair<double, double> Trainer::comm_wait_seconds() const {
  double comm = 0.0, wait = 0.0;
  for (const runtime::Executable* exe : training_executables()) {
    for (const runtime::KernelProfile& k : exe->profile()) {
      const std::string c = category(*k.node);
      if (c == "wait") wait += k.seconds;
      if (c == "communication") comm += k.seconds;
    }
  }
  return {comm, wait};
}

std::vector<Trainer::KernelTime> Trainer::kernel_times() const {
  std::map<std::string, KernelTime> by_name;
  for (const runtime::Executable* exe : training_executables()) {
    for (const runtime::KernelProfile& k : exe->profile()) {
      KernelTime& t = by_name[k.node->name()];
      t.node = k.node->name();
      t.op = k.node->op();
      t.kernel = k.kernel;
      t.category = category(*k.node);
      t.calls += k.calls;
      t.seconds += k.seconds;
      if (k.calls > 0) {
        t.first_calls++;
        t.first_seconds += k.first_seconds;
      }
      t.flops += static_cast<double>(k.flops) * static_cast<double>(k.calls);
      t.elements += static_cast<double>(k.elements) * static_cast<double>(k.calls);
    }
  }
  std::vector<KernelTime> rows;
  for (auto& [name, t] : by_name) {
    if (t.calls > 0) t.elements /= static_cast<double>(t.calls);
    rows.push_back(std::move(t));
  }
  return rows;
}

std::vector<TraceSpan> Trainer::trace_spans() const {
  std::vector<TraceSpan> spans;
  for (const runtime::Executable* exe : training_executables()) {
    std::unordered_map<const ir::Node*, const runtime::KernelProfile*> profile;
    for (const runtime::KernelProfile& k : exe->profile()) profile[k.node] = &k;
    for (const runtime::TraceEvent& e : exe->trace()) {
      const runtime::KernelProfile* k = profile.at(e.node);
      if (e.idle) {  // the part of a receive spent waiting for its message
        spans.push_back({"bubble", "idle", e.node->op(), k->kernel, e.thread, e.begin_us,
                         e.duration_us, 0.0, e.node->name()});
        continue;
      }
      spans.push_back({e.node->name(), category(*e.node), e.node->op(), k->kernel, e.thread,
                       e.begin_us, e.duration_us, static_cast<double>(k->flops)});
    }
  }
  return spans;
}

EvalStats Trainer::evaluate(const Dataset& d) {
  MINIDL_CHECK(d.size() > 0, "evaluation set '", d.name, "' is empty");
  const Shape sample = sample_shape(d);
  const Tensor& targets = options_.targets == TrainerOptions::Targets::Labels ? d.labels : d.images;
  std::vector<std::int64_t> order(d.size());
  std::iota(order.begin(), order.end(), 0);
  // Each rank evaluates its own contiguous shard (an equal split); the sums are reduced.
  const parallel::Slice shard =
      parallel::Layout({.ranks = comm_.size()}).share(comm_.rank(), d.size());
  Sums sums;
  for (std::int64_t start = shard.begin; start < shard.end; start += options_.eval_batch_size) {
    const std::int64_t n = std::min(options_.eval_batch_size, shard.end - start);
    try {
      train::CompiledStep& p = program(false, n, sample);
      const std::span<const std::int64_t> batch = std::span(order).subspan(start, n);
      step(
          p, [&](std::size_t j) { train::gather(p, d.images, targets, batch, j); }, {}, sums);
    } catch (const Error& e) {
      MINIDL_FAIL("evaluation on '", d.name, "': ", e.what());
    }
  }
  sums.reduce(comm_);
  EvalStats s;
  s.samples = d.size();
  s.loss = sums.loss / static_cast<double>(d.size());
  s.accuracy = loss_->classification() ? sums.correct / static_cast<double>(d.size())
                                       : std::numeric_limits<double>::quiet_NaN();
  return s;
}

}  // namespace minidl
