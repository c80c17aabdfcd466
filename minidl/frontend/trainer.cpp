#include "minidl/frontend/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <unordered_map>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/log.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ir/pass.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/parallel/preflight.hpp"
#include "minidl/parallel/reduction_tree.hpp"
#include "minidl/parallel/thread_replicas.hpp"

namespace minidl {

struct Trainer::Program {
  std::unique_ptr<ir::Graph> graph;
  std::unique_ptr<runtime::Executable> exe;
  // Mean over the program's samples; in deterministic mode the micro-shards' means weighted by
  // their shares of the global batch, so only part of the mean when the batch is split.
  ir::Value* loss = nullptr;
  double loss_to_sum = 0.0;  // loss * loss_to_sum: the sum over the program's samples
  // One part per thread replica (one part without replicas): samples [begin, end) of the
  // program's batch, their input buffers and their class probabilities.
  struct Part {
    std::int64_t begin = 0, end = 0;
    ir::Value* probs = nullptr;
    Tensor x, labels;
  };
  std::vector<Part> parts;
  Tensor rng_key;  // the dropout key input (nn::kRngKeyInput), when the graph has one
};

Trainer::Trainer(nn::Module& model, optim::Sgd& optimizer, TrainerOptions options)
    : model_(model),
      optimizer_(optimizer),
      options_(options),
      comm_(options.comm ? *options.comm : parallel::world()) {
  MINIDL_CHECK(options.batch_size >= 1, "batch size must be at least 1, got ", options.batch_size);
  MINIDL_CHECK(options.batch_size >= comm_.size(), "batch size ", options.batch_size,
               " is smaller than the number of ranks, ", comm_.size(),
               ": every rank needs at least one sample of each batch");
  MINIDL_CHECK(options.replicas >= 1, "thread replicas must be at least 1, got ", options.replicas);
  MINIDL_CHECK(options.micro_batch >= 0, "micro-batch must be positive (or 0: off), got ",
               options.micro_batch);
  MINIDL_CHECK(options.micro_batch == 0 || options.batch_size % options.micro_batch == 0,
               "deterministic mode: the micro-batch ", options.micro_batch,
               " does not divide the batch size ", options.batch_size);
  MINIDL_CHECK(options.micro_batch == 0 || micro_shards(options.batch_size) >= comm_.size(),
               "deterministic mode: a batch of ", options.batch_size, " holds ",
               micro_shards(options.batch_size), " micro-shard(s) of ", options.micro_batch,
               ", fewer than the ", comm_.size(),
               " ranks: use a smaller --micro-batch or fewer ranks");
  MINIDL_CHECK(options.eval_batch_size >= 1, "evaluation batch size must be at least 1, got ",
               options.eval_batch_size);
  // The optimizer's state exists before any graph is built, so a checkpoint can fill it.
  optimizer_.init_state(model_.parameters());
}

Trainer::~Trainer() = default;

std::int64_t argmax(const float* row, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t j = 1; j < n; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

std::int64_t Trainer::micro_shards(std::int64_t n) const {
  return (n + options_.micro_batch - 1) / options_.micro_batch;
}

std::pair<std::int64_t, std::int64_t> Trainer::share(std::int64_t start, std::int64_t n) const {
  return share_of(comm_.rank(), start, n);
}

std::pair<std::int64_t, std::int64_t> Trainer::share_of(int rank, std::int64_t start,
                                                        std::int64_t n) const {
  if (options_.micro_batch > 0) {
    const auto [lo, hi] =
        parallel::tree_owners(micro_shards(n), comm_.size())[static_cast<std::size_t>(rank)];
    return {start + lo * options_.micro_batch, start + std::min(hi * options_.micro_batch, n)};
  }
  const std::int64_t p = comm_.size(), r = rank;
  const std::int64_t base = n / p, extra = n % p;
  const std::int64_t begin = start + r * base + std::min(r, extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

Trainer::Program& Trainer::program(bool train, std::int64_t batch, std::int64_t global,
                                   const Shape& sample) {
  auto key = std::make_tuple(train, batch, global, sample.dims());
  auto& slot = programs_[key];
  if (slot) return *slot;
  auto p = std::make_unique<Program>();
  p->graph = std::make_unique<ir::Graph>();
  ir::Graph& g = *p->graph;
  model_.train(train);  // e.g. Dropout adds its nodes to training graphs only
  // Thread replicas (training only): the forward once per replica on its slice of the batch,
  // the loss the share-weighted sum of theirs; the thread-replicas pass does the rest. In
  // deterministic mode the replicas are the micro-shards (this rank's batch starts on a
  // micro-shard boundary), each weighted by its share of the global batch.
  const bool deterministic = train && options_.micro_batch > 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> slices;
  if (deterministic) {
    for (std::int64_t b = 0; b < batch; b += options_.micro_batch)
      slices.emplace_back(b, std::min(b + options_.micro_batch, batch));
  } else {
    const auto replicas = train ? std::min<std::int64_t>(options_.replicas, batch) : 1;
    for (std::int64_t r = 0; r < replicas; ++r)
      slices.emplace_back(batch * r / replicas, batch * (r + 1) / replicas);
  }
  const auto replicas = static_cast<std::int64_t>(slices.size());
  const bool sections = deterministic || replicas > 1;
  ir::Value* loss = nullptr;
  for (std::int64_t r = 0; r < replicas; ++r) {
    Program::Part part;
    std::tie(part.begin, part.end) = slices[static_cast<std::size_t>(r)];
    const std::int64_t n = part.end - part.begin;
    const std::string suffix = replicas > 1 ? fmt::format(".{}", r) : "";
    std::vector<std::int64_t> dims{n};
    dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
    ir::Value* x = ops::input(g, "x" + suffix, Shape(dims));
    ir::Value* labels = ops::input(g, "labels" + suffix, Shape{n}, DType::I32);
    if (sections) {
      parallel::set_replica(*x->producer(), static_cast<int>(r));
      parallel::set_replica(*labels->producer(), static_cast<int>(r));
    }
    ir::Value* logits = model_(x);
    MINIDL_CHECK(logits->shape().rank() == 2 && logits->shape()[0] == n, "the model's output ",
                 logits->shape(), " is not [", n, ", classes]");
    auto [l, probs] = ops::softmax_cross_entropy(logits, labels);
    if (deterministic)
      l = ops::scale(l, static_cast<double>(n) / static_cast<double>(global));
    else if (replicas > 1)
      l = ops::scale(l, static_cast<double>(n) / static_cast<double>(batch));
    loss = loss ? ops::add(loss, l) : l;
    part.probs = probs;
    g.add_output(probs);
    p->parts.push_back(part);
  }
  MINIDL_CHECK(!sections || g.find(nn::kRngKeyInput) == nullptr,
               deterministic ? "deterministic mode does not support dropout yet"
                             : "thread replicas do not support dropout yet: use one replica per "
                               "rank (--thread-mode intra-op)");
  p->loss = loss;
  p->loss_to_sum = static_cast<double>(deterministic ? global : batch);
  g.add_output(p->loss);
  if (train) {
    std::vector<ir::Value*> params;
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter") params.push_back(n->output());
    optimizer_.apply(g, params, autograd::differentiate(g, p->loss, params));
  }
  ir::PassManager pm;
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  if (options_.fuse) pm.add(std::make_unique<ops::FuseBiasActivation>());
  if (sections) pm.add(std::make_unique<parallel::ThreadReplicas>());
  if (train && comm_.size() > 1) {
    parallel::DataParallelOptions dp{.strategy = options_.reduce_strategy,
                                     .bucket_bytes = options_.bucket_bytes,
                                     .overlap = options_.overlap};
    if (deterministic) {
      dp.strategy = parallel::ReduceStrategy::Tree;
      dp.overlap = false;
      dp.tree_leaves = micro_shards(global);
    }
    pm.add(std::make_unique<parallel::DataParallel>(
        comm_, static_cast<double>(batch) / static_cast<double>(global), dp));
  }
  // After the data-parallel passes: the gradients they reduce reach the update from a reduction,
  // not a matmul, and stay unfused; one replica on one rank updates straight from the product.
  // Deterministic mode keeps its updates elementwise, whatever the number of micro-shards.
  if (options_.fuse && train && !deterministic)
    pm.add(std::make_unique<ops::FuseUpdateIntoProduct>());
  // Last: it reads the kernels the runtime will pick, which the passes above may add to.
  pm.add(std::make_unique<ops::PropagateLayouts>(options_.compile.backend));
  pm.run(g);
  if (deterministic) {
    log_verbose("dispatch",
                "deterministic mode: {} micro-shard(s) of this rank's {} samples; their forward "
                "and backward kernels run on one thread each (any kernel then gives the same "
                "bits whatever --threads is); outside them only elementwise kernels run (the "
                "tree's adds, the updates)",
                replicas, batch);
  }
  // Passes may replace an output value (a fused node, a rebuilt sum) but keep its place in the
  // graph's output list: read the values back from there.
  for (std::size_t r = 0; r < p->parts.size(); ++r) p->parts[r].probs = g.outputs()[r];
  p->loss = g.outputs()[p->parts.size()];
  try {
    p->exe = std::make_unique<runtime::Executable>(g, options_.compile);
  } catch (const Error& e) {
    MINIDL_FAIL("compiling the ", train ? "training" : "evaluation", " graph for ", batch,
                " samples", train && batch != global ? fmt::format(" of {}", global) : "", ": ",
                e.what());
  }
  for (std::size_t r = 0; r < p->parts.size(); ++r) {
    const std::string suffix = p->parts.size() > 1 ? fmt::format(".{}", r) : "";
    p->parts[r].x = p->exe->input("x" + suffix);
    p->parts[r].labels = p->exe->input("labels" + suffix);
  }
  if (const ir::Node* k = g.find(nn::kRngKeyInput); k != nullptr && k->op() == "input") {
    p->rng_key = p->exe->input(nn::kRngKeyInput);
    std::fill_n(p->rng_key.data<std::int64_t>(), 2, std::int64_t{0});
  }
  slot = std::move(p);
  return *slot;
}

const ir::Graph& Trainer::training_graph(const Shape& sample) {
  const auto [b, e] = share(0, options_.batch_size);
  return *program(true, e - b, options_.batch_size, sample).graph;
}

void Trainer::gather(const Dataset& d, const std::int64_t* idx, std::int64_t n, Program& p) {
  MINIDL_ASSERT(n == p.parts.back().end);
  const std::int64_t row = d.images.numel() / d.size();
  const float* src = d.images.data<float>();
  const std::int32_t* lab = d.labels.data<std::int32_t>();
  for (Program::Part& part : p.parts) {
    float* x = part.x.data<float>();
    std::int32_t* y = part.labels.data<std::int32_t>();
    for (std::int64_t i = part.begin; i < part.end; ++i) {
      const std::int64_t j = i - part.begin;
      std::memcpy(x + j * row, src + idx[i] * row, static_cast<std::size_t>(row) * sizeof(float));
      y[j] = lab[idx[i]];
    }
  }
}

namespace {
Shape sample_shape(const Dataset& d) {
  const auto& dims = d.images.shape().dims();
  return Shape(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
}

}  // namespace

// Loss and correct predictions summed over this rank's samples, then over the ranks.
struct Trainer::Sums {
  double loss = 0.0;
  double correct = 0.0;
  void reduce(parallel::Communicator& comm) {
    double v[2] = {loss, correct};
    comm.allreduce_sum(v, 2);
    loss = v[0];
    correct = v[1];
  }
};

namespace {
std::int64_t count_correct(const Tensor& probs, const Tensor& labels) {
  const std::int64_t n = probs.shape()[0], c = probs.shape()[1];
  const float* p = probs.data<float>();
  const std::int32_t* y = labels.data<std::int32_t>();
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) correct += argmax(p + i * c, c) == y[i];
  return correct;
}
}  // namespace

void Trainer::step(Program& p, const Dataset& d, const std::int64_t* idx, std::int64_t n,
                   Sums& sums) {
  gather(d, idx, n, p);
  p.exe->run();
  // Checked every step (one number): a run that diverged stops here, before anything saves it.
  const float loss = p.exe->value(p.loss).at(0);
  MINIDL_CHECK(std::isfinite(loss), "the loss over this rank's ", n, " samples is ", loss,
               options_.compile.check_numerics
                   ? ""
                   : "; --check-numerics names the first node that produced a NaN or Inf");
  sums.loss += static_cast<double>(loss) * p.loss_to_sum;
  for (const Program::Part& part : p.parts)
    sums.correct += static_cast<double>(count_correct(p.exe->value(part.probs), part.labels));
}

void Trainer::check_ranks_agree(const Dataset& d, const Shape& sample) {
  if (preflight_done_ || comm_.size() == 1) return;
  std::string description = fmt::format(
      "data {} samples of {}\nbatch {}\nseed {}\nshuffle {}\nmicro-batch {}\n", d.size(), sample,
      options_.batch_size, options_.seed, options_.shuffle, options_.micro_batch);
  if (options_.micro_batch > 0) {
    // Ranks may own subtrees of different sizes (3 ranks: 4, 2 and 2 of 8 micro-shards), so
    // their graphs differ in the number of replicas: every rank compares rank 0's.
    const auto [begin, end] = share_of(0, 0, options_.batch_size);
    description +=
        parallel::fingerprint(*program(true, end - begin, options_.batch_size, sample).graph);
  } else {
    description += parallel::fingerprint(training_graph(sample));
  }
  parallel::preflight(comm_, description);
  preflight_done_ = true;
}

EpochStats Trainer::train_epoch(const Dataset& d, int epoch, const StepCallback& on_step) {
  MINIDL_CHECK(d.size() > 0, "training set '", d.name, "' is empty");
  MINIDL_CHECK(!resume_ || resume_->epoch == epoch, "the trainer resumes in epoch ",
               resume_ ? resume_->epoch : 0, ", but was asked to train epoch ", epoch);
  const Shape sample = sample_shape(d);
  check_ranks_agree(d, sample);
  const auto t0 = std::chrono::steady_clock::now();
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
  if (options_.micro_batch > 0) {
    // The last, ragged batch must still give every rank a micro-shard: skipping it would make
    // the result depend on the rank count.
    const std::int64_t last = d.size() % options_.batch_size;
    MINIDL_CHECK(last == 0 || micro_shards(last) >= comm_.size(), "deterministic mode: the last ",
                 "batch of ", last, " samples holds ", micro_shards(last), " micro-shard(s) of ",
                 options_.micro_batch, ", fewer than the ", comm_.size(),
                 " ranks: use a smaller --micro-batch, fewer ranks, or a training set size that "
                 "leaves a larger last batch");
  }
  const std::int64_t resumed_samples = pos.samples;
  double run_loss = 0.0;
  std::int64_t run_samples = 0;
  for (std::int64_t start = pos.next_sample; start < d.size(); start += options_.batch_size) {
    const std::int64_t n = std::min(options_.batch_size, d.size() - start);
    // A last batch smaller than the number of ranks would leave a rank without samples: every
    // rank skips it (each knows n and the rank count), so no rank waits for another.
    if (n < comm_.size()) break;
    const auto [begin, end] = share(start, n);
    Program& p = program(true, end - begin, n, sample);
    if (p.rng_key.raw() != nullptr) {
      // Dropout masks follow the global step and each sample's place in the global batch, so
      // they are the same however the batch is split over ranks.
      p.rng_key.data<std::int64_t>()[0] = steps_;
      p.rng_key.data<std::int64_t>()[1] = begin - start;
    }
    ++steps_;
    const double before = sums.loss;
    try {
      step(p, d, order.data() + begin, end - begin, sums);
    } catch (const Error& e) {
      MINIDL_FAIL("training step ", steps_, " (epoch ", epoch, ", step ", pos.epoch_step + 1,
                  " of the epoch): ", e.what());
    }
    run_loss += sums.loss - before;
    run_samples += end - begin;
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
  }
  const std::int64_t samples = pos.samples;
  position_ = TrainerPosition{.epoch = epoch + 1, .step = steps_};
  sums.reduce(comm_);
  const auto [comm, wait] = comm_wait_seconds();
  s.comm_seconds = comm - comm_wait_.first;
  s.wait_seconds = wait - comm_wait_.second;
  comm_wait_ = {comm, wait};
  s.samples = samples;
  s.timed_samples = samples - resumed_samples;
  s.loss = sums.loss / static_cast<double>(samples);
  s.accuracy = sums.correct / static_cast<double>(samples);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

std::pair<double, double> Trainer::comm_wait_seconds() const {
  double comm = 0.0, wait = 0.0;
  for (const auto& [key, p] : programs_) {
    if (!std::get<0>(key)) continue;
    for (const runtime::KernelProfile& k : p->exe->profile()) {
      const ir::AttrValue* phase = k.node->annotations().find("phase");
      if (!phase || std::get<std::string>(*phase) != "communication") continue;
      (k.node->op().ends_with("_wait") ? wait : comm) += k.seconds;
    }
  }
  return {comm, wait};
}

std::vector<Trainer::KernelTime> Trainer::kernel_times() const {
  std::map<std::string, KernelTime> by_name;
  for (const auto& [key, p] : programs_) {
    if (!std::get<0>(key)) continue;
    for (const runtime::KernelProfile& k : p->exe->profile()) {
      KernelTime& t = by_name[k.node->name()];
      t.node = k.node->name();
      t.op = k.node->op();
      t.kernel = k.kernel;
      t.calls += k.calls;
      t.seconds += k.seconds;
      t.flops += static_cast<double>(k.flops) * static_cast<double>(k.calls);
    }
  }
  std::vector<KernelTime> rows;
  for (auto& [name, t] : by_name) rows.push_back(std::move(t));
  return rows;
}

namespace {
std::string category(const ir::Node& n) {
  const ir::AttrValue* phase = n.annotations().find("phase");
  const std::string p = phase ? std::get<std::string>(*phase) : std::string();
  if (p == "communication") return n.op().ends_with("_wait") ? "wait" : "communication";
  if (p == "update") return "update";
  return "compute";
}
}  // namespace

std::vector<TraceSpan> Trainer::trace_spans() const {
  std::vector<TraceSpan> spans;
  for (const auto& [key, p] : programs_) {
    if (!std::get<0>(key)) continue;
    std::unordered_map<const ir::Node*, const runtime::KernelProfile*> profile;
    for (const runtime::KernelProfile& k : p->exe->profile()) profile[k.node] = &k;
    for (const runtime::TraceEvent& e : p->exe->trace()) {
      const runtime::KernelProfile* k = profile.at(e.node);
      spans.push_back({e.node->name(), category(*e.node), e.node->op(), k->kernel, e.thread,
                       e.begin_us, e.duration_us, static_cast<double>(k->flops)});
    }
  }
  return spans;
}

EvalStats Trainer::evaluate(const Dataset& d) {
  MINIDL_CHECK(d.size() > 0, "evaluation set '", d.name, "' is empty");
  const Shape sample = sample_shape(d);
  std::vector<std::int64_t> order(d.size());
  std::iota(order.begin(), order.end(), 0);
  // Each rank evaluates its own contiguous shard; the sums are reduced.
  const auto [first, last] = share(0, d.size());
  Sums sums;
  for (std::int64_t start = first; start < last; start += options_.eval_batch_size) {
    const std::int64_t n = std::min(options_.eval_batch_size, last - start);
    try {
      step(program(false, n, 0, sample), d, order.data() + start, n, sums);
    } catch (const Error& e) {
      MINIDL_FAIL("evaluation on '", d.name, "': ", e.what());
    }
  }
  sums.reduce(comm_);
  EvalStats s;
  s.samples = d.size();
  s.loss = sums.loss / static_cast<double>(d.size());
  s.accuracy = sums.correct / static_cast<double>(d.size());
  return s;
}

}  // namespace minidl
