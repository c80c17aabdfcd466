#include "minidl/frontend/trainer.hpp"

#include <chrono>
#include <cstring>
#include <numeric>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/ir/pass.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/parallel/preflight.hpp"

namespace minidl {

struct Trainer::Program {
  std::unique_ptr<ir::Graph> graph;
  std::unique_ptr<runtime::Executable> exe;
  ir::Value* loss = nullptr;
  ir::Value* probs = nullptr;
  Tensor x, labels;
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
  MINIDL_CHECK(options.eval_batch_size >= 1, "evaluation batch size must be at least 1, got ",
               options.eval_batch_size);
}

Trainer::~Trainer() = default;

std::int64_t argmax(const float* row, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t j = 1; j < n; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

std::pair<std::int64_t, std::int64_t> Trainer::share(std::int64_t start, std::int64_t n) const {
  const std::int64_t p = comm_.size(), r = comm_.rank();
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
  std::vector<std::int64_t> dims{batch};
  dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
  ir::Value* x = ops::input(g, "x", Shape(dims));
  ir::Value* labels = ops::input(g, "labels", Shape{batch}, DType::I32);
  ir::Value* logits = model_(x);
  MINIDL_CHECK(logits->shape().rank() == 2 && logits->shape()[0] == batch, "the model's output ",
               logits->shape(), " is not [", batch, ", classes]");
  std::tie(p->loss, p->probs) = ops::softmax_cross_entropy(logits, labels);
  g.add_output(p->loss);
  g.add_output(p->probs);
  if (train) {
    std::vector<ir::Value*> params;
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter") params.push_back(n->output());
    optimizer_.apply(g, params, autograd::differentiate(g, p->loss, params));
  }
  ir::PassManager pm;
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  if (train && comm_.size() > 1) {
    pm.add(std::make_unique<parallel::DataParallel>(
        comm_, static_cast<double>(batch) / static_cast<double>(global)));
  }
  pm.run(g);
  p->exe = std::make_unique<runtime::Executable>(g, options_.compile);
  p->x = p->exe->input("x");
  p->labels = p->exe->input("labels");
  slot = std::move(p);
  return *slot;
}

const ir::Graph& Trainer::training_graph(const Shape& sample) {
  const auto [b, e] = share(0, options_.batch_size);
  return *program(true, e - b, options_.batch_size, sample).graph;
}

void Trainer::gather(const Dataset& d, const std::int64_t* idx, std::int64_t n, Program& p) {
  MINIDL_ASSERT(n == p.x.shape()[0]);
  const std::int64_t row = d.images.numel() / d.size();
  const float* src = d.images.data<float>();
  const std::int32_t* lab = d.labels.data<std::int32_t>();
  float* x = p.x.data<float>();
  std::int32_t* y = p.labels.data<std::int32_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(x + i * row, src + idx[i] * row, static_cast<std::size_t>(row) * sizeof(float));
    y[i] = lab[idx[i]];
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
  sums.loss += static_cast<double>(p.exe->value(p.loss).at(0)) * static_cast<double>(n);
  sums.correct += static_cast<double>(count_correct(p.exe->value(p.probs), p.labels));
}

void Trainer::check_ranks_agree(const Dataset& d, const Shape& sample) {
  if (preflight_done_ || comm_.size() == 1) return;
  std::string description =
      fmt::format("data {} samples of {}\nbatch {}\nseed {}\nshuffle {}\n", d.size(), sample,
                  options_.batch_size, options_.seed, options_.shuffle);
  description += parallel::fingerprint(training_graph(sample));
  parallel::preflight(comm_, description);
  preflight_done_ = true;
}

EpochStats Trainer::train_epoch(const Dataset& d, int epoch) {
  MINIDL_CHECK(d.size() > 0, "training set '", d.name, "' is empty");
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
  std::int64_t samples = 0;
  for (std::int64_t start = 0; start < d.size(); start += options_.batch_size) {
    const std::int64_t n = std::min(options_.batch_size, d.size() - start);
    // A last batch smaller than the number of ranks would leave a rank without samples: every
    // rank skips it (each knows n and the rank count), so no rank waits for another.
    if (n < comm_.size()) break;
    const auto [begin, end] = share(start, n);
    Program& p = program(true, end - begin, n, sample);
    step(p, d, order.data() + begin, end - begin, sums);
    samples += n;
  }
  sums.reduce(comm_);
  s.samples = samples;
  s.loss = sums.loss / static_cast<double>(samples);
  s.accuracy = sums.correct / static_cast<double>(samples);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
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
    step(program(false, n, 0, sample), d, order.data() + start, n, sums);
  }
  sums.reduce(comm_);
  EvalStats s;
  s.samples = d.size();
  s.loss = sums.loss / static_cast<double>(d.size());
  s.accuracy = sums.correct / static_cast<double>(d.size());
  return s;
}

}  // namespace minidl
