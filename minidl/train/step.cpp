#include "minidl/train/step.hpp"

#include <cmath>
#include <cstring>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/log.hpp"
#include "minidl/ir/pass.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/thread_replicas.hpp"
#include "minidl/train/clip.hpp"

namespace minidl::train {

std::int64_t argmax(const float* row, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t j = 1; j < n; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

namespace {

// The pipeline every program runs, in the order its passes' needs allow: autograd's graph has
// its gradients ("differentiated"); an evaluation graph has no gradients or updates, so what the
// training passes provide holds of it from the start.
ir::PassManager pipeline(const StepSpec& spec, const StepOptions& o, parallel::Communicator& comm,
                         std::int64_t local, ClipGradNorm** clip) {
  const parallel::Layout& layout = o.layout;
  if (!spec.train) {
    ir::PassManager pm({"gradients-reduced", "gradients-clipped", "updates-fused"});
    pm.add(std::make_unique<ir::DeadCodeElimination>());
    pm.add(std::make_unique<ops::FuseBiasActivation>(o.fuse));
    pm.add(std::make_unique<ops::PropagateLayouts>(o.compile.backend));
    return pm;
  }
  // One rank's gradients are the reduced ones: no data-parallel pass to run.
  const bool ranks = comm.size() > 1;
  ir::PassManager pm = ranks ? ir::PassManager({"differentiated"})
                             : ir::PassManager({"differentiated", "gradients-reduced"});
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  pm.add(std::make_unique<ops::FuseBiasActivation>(o.fuse));
  pm.add(std::make_unique<parallel::ThreadReplicas>());
  parallel::DataParallelOptions dp{
      .strategy = o.reduce, .bucket_bytes = o.bucket_bytes, .overlap = o.overlap};
  if (layout.deterministic()) {
    dp.strategy = parallel::ReduceStrategy::Tree;
    dp.overlap = false;
    dp.tree_leaves = layout.micro_shards(spec.batch);
  }
  if (ranks) {
    pm.add(std::make_unique<parallel::DataParallel>(
        comm, static_cast<double>(local) / static_cast<double>(spec.batch), dp));
  }
  auto c = std::make_unique<ClipGradNorm>(o.clip_grad_norm);
  *clip = c.get();
  pm.add(std::move(c));
  // Deterministic mode keeps its updates elementwise, whatever the number of micro-shards.
  pm.add(std::make_unique<ops::FuseUpdateIntoProduct>(o.fuse && !layout.deterministic()));
  // It reads the kernels the runtime will pick, which the passes above may change.
  pm.add(std::make_unique<ops::PropagateLayouts>(o.compile.backend));
  return pm;
}

}  // namespace

CompiledStep compile_step(Model& model, const Loss& loss, optim::Optimizer* optimizer,
                          const StepSpec& spec, const StepOptions& o) {
  MINIDL_CHECK(spec.batch >= 1, "compile_step: the batch must hold at least one sample, got ",
               spec.batch);
  MINIDL_CHECK(!spec.train || optimizer != nullptr, "compile_step: training needs an optimizer");
  parallel::Communicator& comm = o.comm ? *o.comm : parallel::world();
  MINIDL_CHECK(comm.size() == o.layout.ranks(), "compile_step: the layout has ", o.layout.ranks(),
               " rank(s), the communicator ", comm.size());
  const parallel::Layout& layout = o.layout;
  CompiledStep s;
  if (spec.train) {
    layout.check_batch(spec.batch, "a batch");
    MINIDL_CHECK(spec.as_rank < comm.size(), "compile_step: rank ", spec.as_rank, " of ",
                 comm.size());
    s.share_ = layout.share(spec.as_rank >= 0 ? spec.as_rank : comm.rank(), spec.batch);
  } else {
    s.share_ = {0, spec.batch};
  }
  const std::int64_t local = s.share_.size();
  const std::vector<parallel::Slice> slices = layout.replicas(local, spec.train);
  const bool sections = layout.sections(local, spec.train);
  const auto replicas = static_cast<std::int64_t>(slices.size());
  s.graph_ = std::make_unique<ir::Graph>();
  ir::Graph& g = *s.graph_;
  model.train(spec.train);  // e.g. Dropout adds its nodes to training graphs only
  s.classification_ = loss.classification();
  ir::Value* total = nullptr;
  std::vector<ir::Value*> predictions;
  for (std::int64_t r = 0; r < replicas; ++r) {
    CompiledStep::Part part{slices[static_cast<std::size_t>(r)].begin,
                            slices[static_cast<std::size_t>(r)].end};
    const std::int64_t n = part.end - part.begin;
    const std::string suffix = replicas > 1 ? fmt::format(".{}", r) : "";
    std::vector<std::int64_t> dims{n};
    dims.insert(dims.end(), spec.sample.dims().begin(), spec.sample.dims().end());
    ir::Value* x = ops::input(g, "x" + suffix, Shape(dims));
    if (sections) x->producer()->set_replica(static_cast<int>(r));
    ir::Value* out = model.forward(x);
    MINIDL_CHECK(out->shape().rank() >= 1 && out->shape()[0] == n, "the model's output ",
                 out->shape(), " does not have the batch's ", n, " samples first");
    TargetSpec t = loss.target(out->shape());
    if (r == 0) s.target_ = t;
    ir::Value* target = ops::input(g, "target" + suffix, t.shape, t.dtype);
    if (sections) target->producer()->set_replica(static_cast<int>(r));
    LossNodes l = loss.build(out, target);
    // Each slice's mean weighted by its share: of the global batch in deterministic mode (the
    // rank's loss is then its subtree's part), of the rank's batch otherwise.
    ir::Value* weighted = l.loss;
    if (spec.train && layout.deterministic())
      weighted = ops::scale(l.loss, static_cast<double>(n) / static_cast<double>(spec.batch));
    else if (replicas > 1)
      weighted = ops::scale(l.loss, static_cast<double>(n) / static_cast<double>(local));
    total = total ? ops::add(total, weighted) : weighted;
    if (l.predictions) g.add_output(l.predictions);
    predictions.push_back(l.predictions);
    s.parts_.push_back(std::move(part));
  }
  MINIDL_CHECK(!sections || g.find(ir::Role::RngKey) == nullptr,
               layout.deterministic() ? "deterministic mode does not support dropout yet"
                                      : "thread replicas do not support dropout yet: use one "
                                        "replica per rank (--thread-mode intra-op)");
  s.loss_to_sum_ = static_cast<double>(spec.train && layout.deterministic() ? spec.batch : local);
  g.add_output(total);
  if (spec.train) {
    std::vector<ir::Value*> params;
    for (ir::Node* n : g.nodes())
      if (n->op() == "parameter") params.push_back(n->output());
    const optim::StepInputs in{
        ops::role_input(g, ir::Role::LearningRate, "lr", Shape{}, DType::F32),
        ops::role_input(g, ir::Role::OptimizerStep, "optimizer_step", Shape{}, DType::I64)};
    optimizer->apply(g, params, autograd::differentiate(g, total, params), in);
  }
  ClipGradNorm* clip = nullptr;
  ir::PassManager pm = pipeline(spec, o, comm, local, &clip);
  pm.run(g);
  if (spec.train && layout.deterministic()) {
    log_verbose("dispatch",
                "deterministic mode: {} micro-shard(s) of this rank's {} samples; their forward "
                "and backward kernels run on one thread each (any kernel then gives the same "
                "bits whatever --threads is); outside them only elementwise kernels run (the "
                "tree's adds, the updates)",
                replicas, local);
  }
  // Passes may replace an output value (a fused node, a rebuilt sum) but keep its place in the
  // graph's output list: read the values back from there.
  std::size_t out = 0;
  for (std::size_t r = 0; r < s.parts_.size(); ++r)
    if (predictions[r] != nullptr) s.parts_[r].predictions = g.outputs()[out++];
  s.loss_ = g.outputs()[out];
  if (clip != nullptr && clip->norm() != nullptr) s.norm_ = clip->norm();
  try {
    s.exe_ = std::make_unique<runtime::Executable>(g, o.compile);
  } catch (const Error& e) {
    MINIDL_FAIL(
        "compiling the ", spec.train ? "training" : "evaluation", " graph for ", local, " samples",
        spec.train && local != spec.batch ? fmt::format(" of {}", spec.batch) : "", ": ", e.what());
  }
  for (std::size_t r = 0; r < s.parts_.size(); ++r) {
    const std::string suffix = s.parts_.size() > 1 ? fmt::format(".{}", r) : "";
    s.parts_[r].x = s.exe_->input("x" + suffix);
    s.parts_[r].target = s.exe_->input("target" + suffix);
  }
  auto role_tensor = [&](ir::Role role) {
    const ir::Node* n = g.find(role);
    return n != nullptr && n->op() == "input" ? s.exe_->input(n->name()) : Tensor();
  };
  s.lr_ = role_tensor(ir::Role::LearningRate);
  s.step_ = role_tensor(ir::Role::OptimizerStep);
  s.rng_key_ = role_tensor(ir::Role::RngKey);
  if (s.rng_key_.raw() != nullptr) std::fill_n(s.rng_key_.data<std::int64_t>(), 2, 0);
  s.check_numerics_ = o.compile.check_numerics;
  return s;
}

void CompiledStep::run(const StepFeed& feed) {
  if (lr_.raw() != nullptr) *lr_.data<float>() = static_cast<float>(feed.lr);
  if (step_.raw() != nullptr) *step_.data<std::int64_t>() = feed.step + 1;
  if (rng_key_.raw() != nullptr) {
    // Dropout masks follow the global step and each sample's place in the global batch, so
    // they are the same however the batch is split over ranks.
    rng_key_.data<std::int64_t>()[0] = feed.step;
    rng_key_.data<std::int64_t>()[1] = feed.first_sample;
  }
  exe_->run();
  // Checked every step (one number): a run that diverged stops here, before anything saves it.
  const float loss = exe_->value(loss_).at(0);
  MINIDL_CHECK(std::isfinite(loss), "the loss over this rank's ", share_.size(), " samples is ",
               loss,
               check_numerics_ ? ""
                               : "; --check-numerics names the first node that produced a NaN "
                                 "or Inf");
}

double CompiledStep::loss_sum() const {
  return static_cast<double>(exe_->value(loss_).at(0)) * loss_to_sum_;
}

std::int64_t CompiledStep::correct() const {
  MINIDL_CHECK(classification_, "correct(): the loss does not classify");
  std::int64_t correct = 0;
  for (const Part& part : parts_) {
    const Tensor& probs = exe_->value(part.predictions);
    const std::int64_t n = probs.shape()[0], c = probs.shape()[1];
    const float* p = probs.data<float>();
    const std::int32_t* y = part.target.data<std::int32_t>();
    for (std::int64_t i = 0; i < n; ++i) correct += argmax(p + i * c, c) == y[i];
  }
  return correct;
}

std::optional<double> CompiledStep::grad_norm() const {
  if (norm_ == nullptr) return std::nullopt;
  return static_cast<double>(exe_->value(norm_).at(0));
}

}  // namespace minidl::train
