#include "minidl/train/step.hpp"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/log.hpp"
#include "minidl/ir/pass.hpp"
#include "minidl/ops/common.hpp"
#include "minidl/ops/fusion.hpp"
#include "minidl/ops/layouts.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/ops/relu_max_pool.hpp"
#include "minidl/parallel/cross_replica_sums.hpp"
#include "minidl/parallel/op_table.hpp"
#include "minidl/parallel/tensor_parallel.hpp"
#include "minidl/parallel/thread_replicas.hpp"
#include "minidl/train/clip.hpp"
#include "minidl/train/pipeline_graph.hpp"
#include "minidl/train/stage_balance.hpp"
#include "minidl/train/zero_update.hpp"

namespace minidl::train {

std::int64_t argmax(const float* row, std::int64_t n) {
  std::int64_t best = 0;
  for (std::int64_t j = 1; j < n; ++j)
    if (row[j] > row[best]) best = j;
  return best;
}

namespace {

// What a program of a step does.
enum class Job {
  Step,       // forward, backward, reduction and update of the whole batch
  Gradients,  // forward and backward of one micro-step; the gradients are outputs
  Apply,      // the micro-steps' summed gradients (inputs): reduction and update
  Evaluate,   // forward only
};

// The pipeline every program runs, in the order its passes' needs allow: autograd's graph has
// its gradients ("differentiated"); a graph without updates has nothing the update passes would
// change, so what they provide holds of it from the start. `reduce`: this rank's share of the
// batch for the data-parallel pass, none when the gradients need no reduction in the graph
// (one rank; a micro-step's, summed outside it).
ir::PassManager pipeline(Job job, const StepOptions& o, parallel::Communicator& comm,
                         std::optional<double> reduce, std::int64_t tree_leaves,
                         ClipGradNorm** clip, ir::Value* clip_total = nullptr) {
  const parallel::Layout& layout = o.layout;
  std::vector<std::string> facts;
  if (job != Job::Evaluate) facts.push_back("differentiated");
  if (!reduce) facts.push_back("gradients-reduced");
  if (job == Job::Evaluate || job == Job::Gradients)
    facts.insert(facts.end(), {"gradients-clipped", "updates-fused"});
  ir::PassManager pm(facts);
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  pm.add(std::make_unique<ops::MixedPrecision>(o.compile.precision));
  pm.add(std::make_unique<ops::FuseBiasActivation>(o.fuse));
  if (job != Job::Evaluate) {
    pm.add(std::make_unique<ops::FuseBatchNormBackward>(o.fuse));
    pm.add(std::make_unique<ops::FuseBiasIntoWeightGradient>(o.fuse));
  }
  if (job == Job::Evaluate) pm.add(std::make_unique<ops::FoldBatchNorm>(o.fuse));
  pm.add(std::make_unique<ops::FuseResidualIntoBatchNorm>(o.fuse));
  if (job != Job::Evaluate) pm.add(std::make_unique<parallel::ThreadReplicas>());
  if (job != Job::Evaluate) pm.add(std::make_unique<ops::FuseActivationBackward>(o.fuse));
  if (job != Job::Evaluate && comm.size() > 1)
    pm.add(std::make_unique<parallel::CrossReplicaSums>(comm, tree_leaves));
  if (reduce) {
    parallel::DataParallelOptions dp{
        .strategy = o.reduce, .bucket_bytes = o.bucket_bytes, .overlap = o.overlap};
    dp.partition.stages = job == Job::Step ? o.pipeline.stages : 1;
    if (layout.deterministic()) {
      dp.strategy = parallel::ReduceStrategy::Tree;
      dp.tree_by_node = o.reduce == parallel::ReduceStrategy::Hierarchical;
      dp.overlap = false;
      dp.tree_leaves = tree_leaves;
    }
    dp.partition.shards = layout.options().shards;
    pm.add(std::make_unique<parallel::DataParallel>(comm, *reduce, dp));
  }
  if (job == Job::Step || job == Job::Apply) {
    auto c = std::make_unique<ClipGradNorm>(o.clip_grad_norm, clip_total);
    *clip = c.get();
    pm.add(std::move(c));
    // Deterministic mode keeps its updates elementwise, whatever the number of micro-shards.
    pm.add(std::make_unique<ops::FuseUpdateIntoProduct>(o.fuse && !layout.deterministic()));
    pm.add(std::make_unique<ir::UpdatesWhenReady>());
  }
  // It reads the kernels the runtime will pick, which the passes above may change.
  pm.add(std::make_unique<ops::PropagateLayouts>(o.compile.backend));
  pm.add(std::make_unique<ops::FuseMaxPoolIntoConvolution>(o.fuse));
  if (job != Job::Evaluate)
    pm.add(std::make_unique<ops::FusePoolBackwardIntoWeightGradient>(o.fuse));
  return pm;
}

// The parameter values of g, in graph order (the order every program of a step uses).
std::vector<ir::Value*> parameters_of(const ir::Graph& g) {
  std::vector<ir::Value*> params;
  for (ir::Node* n : g.nodes())
    if (n->op() == "parameter") params.push_back(n->output());
  return params;
}

std::string program_name(Job job, std::int64_t local, std::int64_t batch) {
  const std::string of = local != batch ? fmt::format(" of {}", batch) : "";
  switch (job) {
    case Job::Step:
      return fmt::format("the training graph for {}{} samples", local, of);
    case Job::Gradients:
      return fmt::format("the micro-step graph for {}{} samples", local, of);
    case Job::Apply:
      return "the graph that applies the summed gradients";
    case Job::Evaluate:
      break;
  }
  return fmt::format("the evaluation graph for {} samples", local);
}

std::unique_ptr<runtime::Executable> compile(const ir::Graph& g, const StepOptions& o,
                                             const std::string& what) {
  try {
    return std::make_unique<runtime::Executable>(g, o.compile);
  } catch (const Error& e) {
    MINIDL_FAIL("compiling ", what, ": ", e.what());
  }
}

// The executable's input of the node with `role`, if it is one.
Tensor role_tensor(const ir::Graph& g, const runtime::Executable& exe, ir::Role role) {
  const ir::Node* n = g.find(role);
  return n != nullptr && n->op() == "input" ? exe.input(n->name()) : Tensor();
}

// The combinations tensor parallelism supports (the app refuses the others by flag first).
void check_tensor_parallel(const StepOptions& o, int shards) {
  MINIDL_CHECK(shards == o.layout.options().shards, "compile_step: the layout has ",
               o.layout.options().shards, " tensor-parallel shard(s), the shards' communicator ",
               shards);
  if (shards == 1) return;
  MINIDL_CHECK(o.zero == 0, "--tensor-parallel does not combine with --zero");
  MINIDL_CHECK(o.layout.accumulate() == 1, "--tensor-parallel does not combine with --accumulate");
  MINIDL_CHECK(o.clip_grad_norm == 0.0,
               "--tensor-parallel does not combine with --clip-grad-norm (the norm would need "
               "the pieces' sums from every shard)");
  MINIDL_CHECK(!o.overlap, "--tensor-parallel does not combine with --overlap");
}

}  // namespace

parallel::ZeroPlan zero_plan(Model& model, int ranks) {
  std::vector<std::pair<std::string, Shape>> params;
  for (const auto& [name, t] : model.parameters()) params.emplace_back(name, t.shape());
  return parallel::ZeroPlan::make(params, ranks);
}

std::vector<std::pair<std::string, Shape>> zero_state_shapes(const parallel::ZeroPlan& plan,
                                                             int rank) {
  std::vector<std::pair<std::string, Shape>> out;
  for (std::size_t i = 0; i < plan.names.size(); ++i) {
    const parallel::Slice p = plan.piece(i, rank);
    if (p.size() > 0) out.emplace_back(plan.names[i], Shape{p.size()});
  }
  return out;
}

CompiledStep compile_step(Model& model, const Loss& loss, optim::Optimizer* optimizer,
                          const StepSpec& spec, const StepOptions& o) {
  MINIDL_CHECK(spec.batch >= 1, "compile_step: the batch must hold at least one sample, got ",
               spec.batch);
  MINIDL_CHECK(!spec.train || optimizer != nullptr, "compile_step: training needs an optimizer");
  ops::check_precision(o.compile.precision);
  // Programs find parameters by name, and the optimizer names its state after them.
  check_names(model);
  parallel::Communicator& comm = o.comm ? *o.comm : parallel::world();
  MINIDL_CHECK(comm.size() == o.layout.ranks(), "compile_step: the layout has ", o.layout.ranks(),
               " rank(s), the communicator ", comm.size());
  MINIDL_CHECK(spec.as_rank < comm.size(), "compile_step: rank ", spec.as_rank, " of ",
               comm.size());
  const parallel::Layout& layout = o.layout;
  const int rank = spec.as_rank >= 0 ? spec.as_rank : comm.rank();
  const bool det = spec.train && layout.deterministic();
  MINIDL_CHECK(o.zero >= 0 && o.zero <= 2, "--zero ", o.zero,
               " (expected 0: off, 1: optimizer state sharded, 2: gradients too)");
  const parallel::TensorParallelOptions tensor{
      .shards = o.tensor_comm ? o.tensor_comm->size() : 1,
      .rank = o.tensor_comm ? o.tensor_comm->rank() : 0,
      .group = o.tensor_comm ? parallel::register_group(o.tensor_comm) : 0};
  check_tensor_parallel(o, tensor.shards);
  CompiledStep s;
  s.classification_ = loss.classification();
  s.check_numerics_ = o.compile.check_numerics;
  model.train(spec.train);  // e.g. Dropout adds its nodes to training graphs only

  const std::vector<parallel::Slice> steps =
      spec.train ? layout.micro_steps(spec.batch) : std::vector<parallel::Slice>{{0, spec.batch}};
  const bool accumulate = steps.size() > 1;
  const Job job = !spec.train ? Job::Evaluate : accumulate ? Job::Gradients : Job::Step;
  // Pipeline stages: this rank's program holds its stage; its replicas are the micro-batches.
  const bool piped = spec.train && o.pipeline.stages > 1;
  const int stages = o.pipeline.stages, stage = o.pipeline.stage;
  const bool last_stage = !piped || stage == stages - 1;
  if (piped) {
    // Ranks are stages x data-parallel replicas, stage-major: stage s's replica d is rank
    // s * D + d of the pipeline's communicator, comm is its stage's replicas.
    MINIDL_CHECK(!accumulate && o.zero == 0 && o.pipeline.comm != nullptr &&
                     o.pipeline.comm->size() == stages * comm.size() &&
                     o.pipeline.comm->rank() == stage * comm.size() + comm.rank(),
                 "pipeline stages: ", stages, " stage(s) x ", comm.size(),
                 " replica(s) do not lay out the ", o.pipeline.comm ? o.pipeline.comm->size() : 0,
                 " ranks (stage-major), or gradient accumulation or ZeRO is on");
    MINIDL_CHECK(o.clip_grad_norm == 0.0,
                 "pipeline stages do not combine with --clip-grad-norm yet");
    MINIDL_CHECK(tensor.shards == 1, "pipeline stages do not combine with --tensor-parallel yet");
  }
  std::vector<std::string> param_names;

  // One program per micro-step size (one without accumulation).
  std::map<std::int64_t, std::size_t> by_size;
  for (const parallel::Slice& step : steps) {
    const auto [it, added] = by_size.try_emplace(step.size(), s.programs_.size());
    s.micro_.push_back({step, it->second});
    if (!added) continue;
    const std::int64_t size = step.size();
    CompiledStep::Program& p = s.programs_.emplace_back();
    p.share = spec.train ? layout.share(rank, size) : parallel::Slice{0, size};
    const std::int64_t local = p.share.size();
    const std::vector<parallel::Slice> slices = layout.replicas(local, spec.train);
    const bool sections = layout.sections(local, spec.train);
    const auto replicas = static_cast<std::int64_t>(slices.size());
    // Each slice's mean is weighted by its share: of the global batch when other ranks or
    // micro-steps hold part of it (the rank's loss is then its part of the batch's: the
    // gradients need only be summed, and a gradient that flows across ranks through a
    // cross_replica_sum carries every rank's weight), of the rank's samples otherwise.
    const std::int64_t denominator =
        spec.train && (accumulate || comm.size() > 1) ? spec.batch : local;
    p.loss_to_sum = static_cast<double>(denominator);
    p.graph = std::make_unique<ir::Graph>();
    ir::Graph& g = *p.graph;
    ir::Value* total = nullptr;
    std::vector<ir::Value*> predictions;
    std::vector<ForwardRange> forwards;
    std::vector<std::pair<Shape, TargetSpec>> part_shapes;  // x's and the target's
    for (std::int64_t r = 0; r < replicas; ++r) {
      CompiledStep::Part part{slices[static_cast<std::size_t>(r)].begin,
                              slices[static_cast<std::size_t>(r)].end};
      const std::int64_t n = part.end - part.begin;
      const std::string suffix = replicas > 1 ? fmt::format(".{}", r) : "";
      const std::size_t replica_begin = g.nodes().size();
      std::vector<std::int64_t> dims{n};
      dims.insert(dims.end(), spec.sample.dims().begin(), spec.sample.dims().end());
      ir::Value* x = ops::input(g, "x" + suffix, Shape(dims));
      if (sections) x->producer()->set_replica(static_cast<int>(r));
      const std::size_t forward_begin = g.nodes().size();
      ir::Value* out = model.forward(x);
      forwards.push_back({forward_begin, g.nodes().size(), out});
      MINIDL_CHECK(out->shape().rank() >= 1 && out->shape()[0] == n, "the model's output ",
                   out->shape(), " does not have the batch's ", n, " samples first");
      TargetSpec t = loss.target(out->shape());
      if (r == 0 && s.programs_.size() == 1) s.target_ = t;  // parts(0)[0]'s
      ir::Value* target = ops::input(g, "target" + suffix, t.shape, t.dtype);
      if (sections) target->producer()->set_replica(static_cast<int>(r));
      LossNodes l = loss.build(out, target);
      ir::Value* weighted = l.loss;
      if (n != denominator)
        weighted = ops::scale(l.loss, static_cast<double>(n) / static_cast<double>(denominator));
      if (piped) {
        // The pipeline's cut and schedule follow each micro-batch's nodes.
        for (std::size_t i = replica_begin; i < g.nodes().size(); ++i)
          if (!g.nodes()[i]->def().is_source()) g.nodes()[i]->set_replica(static_cast<int>(r));
      }
      total = total ? ops::add(total, weighted) : weighted;
      part_shapes.emplace_back(Shape(dims), t);
      if (!last_stage) l.predictions = nullptr;
      if (l.predictions) g.add_output(l.predictions);
      predictions.push_back(l.predictions);
      p.parts.push_back(std::move(part));
    }
    MINIDL_CHECK(!sections || g.find(ir::Role::RngKey) == nullptr,
                 layout.deterministic() ? "deterministic mode does not support dropout yet"
                 : piped                ? "pipeline stages do not support dropout yet"
                                        : "thread replicas do not support dropout yet: use one "
                                          "replica per rank (--thread-mode intra-op)");
    if (last_stage) g.add_output(total);
    std::vector<ir::Value*> grads;
    std::vector<PipelineAction> actions;  // this stage's schedule
    const std::int64_t leaves = layout.deterministic() ? layout.micro_shards(size) : 0;
    ir::Value* clip_total = nullptr;  // with ZeRO, from the shards
    // Tensor parallelism: the split pairs read this rank's parts of their parameters (the
    // parameters it stores), which the backward and the updates then see alone. Evaluation
    // splits them too, so that no program gathers a split parameter whole (the shards of a
    // replica evaluate the same samples).
    if (tensor.shards > 1) {
      ir::PassManager before;
      before.add(std::make_unique<parallel::TensorParallel>(tensor));
      before.run(g);
    }
    // Forward rewrites run before autograd, which then derives the backward from them.
    {
      ir::PassManager forward;
      forward.add(std::make_unique<ops::ReluAfterMaxPool>(o.fuse));
      forward.run(g);
    }
    if (spec.train) {
      if (o.sync_batch_stats) parallel::use_global_statistics(g);
      std::vector<ir::Value*> params = parameters_of(g);
      if (piped) {
        const auto micro = static_cast<int>(replicas);
        const auto schedule = make_schedule(o.pipeline.schedule, stages, micro);
        check_schedule(schedule, micro);
        actions = schedule[static_cast<std::size_t>(stage)];
        if (s.programs_.size() == 1) s.schedule_ = schedule;
        std::string summary;
        // --stage-balance time: every forward node's time, profiled once per run in one
        // process on a micro-batch (the same table on every rank).
        auto& measured = *o.pipeline.node_seconds;
        if (o.pipeline.boundaries.empty() && o.pipeline.balance == "time" && !measured)
          measured = profile_forward(model, loss, *optimizer, spec.sample, slices[0].size(), o,
                                     *o.pipeline.comm);
        const auto stage_of = assign_stages(g, forwards, stages, o.pipeline.boundaries, &summary,
                                            measured ? &*measured : nullptr, o.pipeline.balance);
        if (s.programs_.size() == 1) log_verbose("pipeline", "{}", summary);
        // Once per cut: every batch size cuts alike (the shorter last batch's FLOPs differ,
        // not its cut).
        static std::string printed;
        const std::string cut_names = summary.substr(0, summary.find(';'));
        if (o.pipeline.comm->rank() == 0 && spec.as_rank < 0 && cut_names != printed) {
          fmt::print("{}\n", summary);
          printed = cut_names;
        }
        const int group = parallel::register_group(o.pipeline.comm);
        // The same replica of the neighbouring stages.
        const int prev_rank = (stage - 1) * comm.size() + rank;
        const int next_rank = (stage + 1) * comm.size() + rank;
        const StageCut cut = cut_stage(g, stage_of, stage, group, prev_rank, next_rank);
        ir::DeadCodeElimination().run(g);  // the other stages' nodes
        const auto seeds = receive_gradients(g, cut, stage, next_rank, group);
        params.clear();  // this stage's: those still read
        for (ir::Value* v : parameters_of(g))
          if (!v->users().empty()) params.push_back(v);
        std::vector<ir::Value*> wrt = params;
        for (const auto& r : cut.received) wrt.insert(wrt.end(), r.begin(), r.end());
        std::vector<ir::Value*> losses;
        if (last_stage) losses.push_back(total);
        std::vector<ir::Value*> all = autograd::differentiate(g, losses, seeds, wrt);
        send_gradients(g, cut,
                       std::vector<ir::Value*>(
                           all.begin() + static_cast<std::ptrdiff_t>(params.size()), all.end()),
                       stage, prev_rank, group);
        all.resize(params.size());
        grads = std::move(all);
      } else {
        grads = autograd::differentiate(g, total, params);
      }
      if (job == Job::Step && o.zero > 0) {
        // ZeRO: this rank updates the pieces of its shard, with state for them only.
        const optim::StepInputs in{
            ops::role_input(g, ir::Role::LearningRate, "lr", Shape{}, DType::F32),
            ops::role_input(g, ir::Role::OptimizerStep, "optimizer_step", Shape{}, DType::I64)};
        clip_total = zero_update(g, model, *optimizer, params, grads, in,
                                 {.stage = o.zero,
                                  .rank = rank,
                                  .comm = &comm,
                                  .tree_leaves = det ? leaves : 0,
                                  .clip = o.clip_grad_norm > 0.0});
      } else if (job == Job::Step) {
        const optim::StepInputs in{
            ops::role_input(g, ir::Role::LearningRate, "lr", Shape{}, DType::F32),
            ops::role_input(g, ir::Role::OptimizerStep, "optimizer_step", Shape{}, DType::I64)};
        optimizer->apply(g, params, grads, in);
      } else {
        param_names.clear();
        for (ir::Value* v : params) param_names.push_back(v->producer()->name());
        for (ir::Value* v : grads) g.add_output(v);
      }
    }
    if (piped)  // the backward and the updates too: the graph is one stage's
      for (ir::Node* n : g.nodes()) parallel::set_stage(*n, stage);
    ClipGradNorm* clip = nullptr;
    // Without accumulation the data-parallel pass sums the ranks' gradients (each weighted by
    // its share of the batch already); a micro-step's gradients are reduced after the sum (the
    // apply program) or, in deterministic mode, joined in the tree after each micro-step.
    std::optional<double> reduce;
    if (job == Job::Step && comm.size() > 1 && o.zero == 0) reduce = 1.0;
    // The pass manager owns the passes: clip lives as long as it.
    ir::PassManager pm = pipeline(job, o, comm, reduce, leaves, &clip, clip_total);
    pm.run(g);
    if (piped) order_by_schedule(g, actions);
    if (det) {
      log_verbose("dispatch",
                  "deterministic mode: {} micro-shard(s) of this rank's {} samples; their "
                  "forward and backward kernels run on one thread each (any kernel then gives "
                  "the same bits whatever --threads is); outside them run the tree's adds, "
                  "the cross-replica sums and what reads only them (BatchNorm's moments under "
                  "--sync-bn), and the updates: kernels whose bits do not depend on the thread "
                  "count",
                  replicas, local);
    }
    // Passes may replace an output value (a fused node, a rebuilt sum) but keep its place in
    // the graph's output list: read the values back from there.
    std::size_t out = 0;
    for (std::size_t r = 0; r < p.parts.size(); ++r)
      if (predictions[r] != nullptr) p.parts[r].predictions = g.outputs()[out++];
    if (last_stage) p.loss = g.outputs()[out++];
    for (std::size_t i = 0; i < grads.size() && job == Job::Gradients; ++i)
      p.grads.push_back(g.outputs()[out++]);
    if (clip != nullptr && clip->norm() != nullptr) s.norm_ = clip->norm();
    p.exe = compile(g, o, program_name(job, local, size));
    if (s.norm_ != nullptr) s.norm_exe_ = p.exe.get();
    for (std::size_t r = 0; r < p.parts.size(); ++r) {
      const std::string suffix = p.parts.size() > 1 ? fmt::format(".{}", r) : "";
      // A pipeline stage reads only its own: the samples in the first, the targets in the last
      // (the others get buffers of their own, so every stage is fed alike).
      const auto& [xs, ts] = part_shapes[r];
      p.parts[r].x = g.find("x" + suffix) ? p.exe->input("x" + suffix) : Tensor::empty(xs);
      p.parts[r].target = g.find("target" + suffix) ? p.exe->input("target" + suffix)
                                                    : Tensor::empty(ts.shape, ts.dtype);
    }
    p.lr = role_tensor(g, *p.exe, ir::Role::LearningRate);
    p.step = role_tensor(g, *p.exe, ir::Role::OptimizerStep);
    p.rng_key = role_tensor(g, *p.exe, ir::Role::RngKey);
    if (p.rng_key.raw() != nullptr) std::fill_n(p.rng_key.data<std::int64_t>(), 2, 0);
    if (det && accumulate) {
      std::int64_t numel = 0;
      for (ir::Value* v : p.grads) numel += v->shape().numel();
      p.tree = std::make_unique<parallel::TreeAllreduce>(
          comm, leaves, numel,
          o.reduce == parallel::ReduceStrategy::Hierarchical ? &comm.split_shared() : nullptr);
    }
  }
  if (!accumulate) return s;

  s.joins_ = layout.micro_step_joins(spec.batch);
  s.add_apply_program(model, *optimizer, param_names, o, comm, rank);
  return s;
}

// The apply program: the summed gradients as inputs, reduced across ranks (but in
// deterministic mode, where the tree has joined them already), clipped and applied.
void CompiledStep::add_apply_program(Model& model, optim::Optimizer& optimizer,
                                     const std::vector<std::string>& param_names,
                                     const StepOptions& o, parallel::Communicator& comm, int rank) {
  auto& a = *(apply_ = std::make_unique<Program>());
  a.graph = std::make_unique<ir::Graph>();
  ir::Graph& g = *a.graph;
  std::map<std::string, Tensor> storage;
  for (auto& [name, t] : model.parameters()) storage.emplace(name, t);
  std::vector<ir::Value*> params, grads;
  offsets_ = {0};
  for (const std::string& name : param_names) {
    const auto it = storage.find(name);
    MINIDL_CHECK(it != storage.end(), "compile_step: the graph's parameter '", name,
                 "' is not among the model's parameters");
    params.push_back(ops::parameter(g, name, it->second));
    grads.push_back(ops::input(g, "grad." + name, it->second.shape()));
    offsets_.push_back(offsets_.back() + it->second.numel());
  }
  const optim::StepInputs in{
      ops::role_input(g, ir::Role::LearningRate, "lr", Shape{}, DType::F32),
      ops::role_input(g, ir::Role::OptimizerStep, "optimizer_step", Shape{}, DType::I64)};
  // ZeRO reduces the sums to this rank's shard itself (in deterministic mode, where the tree
  // has summed them, it only takes the shard).
  ir::Value* clip_total = nullptr;
  if (o.zero > 0) {
    clip_total = zero_update(g, model, optimizer, params, grads, in,
                             {.stage = o.zero,
                              .rank = rank,
                              .comm = &comm,
                              .reduced = o.layout.deterministic(),
                              .clip = o.clip_grad_norm > 0.0});
  } else {
    optimizer.apply(g, params, grads, in);
  }
  ClipGradNorm* clip = nullptr;
  std::optional<double> reduce;
  // Each rank's sum is weighted by the global batch already.
  if (comm.size() > 1 && !o.layout.deterministic() && o.zero == 0) reduce = 1.0;
  ir::PassManager pm = pipeline(Job::Apply, o, comm, reduce, 0, &clip, clip_total);  // owns clip
  pm.run(g);
  a.exe = compile(g, o, program_name(Job::Apply, 0, 0));
  if (clip->norm() != nullptr) {
    norm_ = clip->norm();
    norm_exe_ = a.exe.get();
  }
  for (const std::string& name : param_names) apply_grads_.push_back(a.exe->input("grad." + name));
  a.lr = role_tensor(g, *a.exe, ir::Role::LearningRate);
  a.step = role_tensor(g, *a.exe, ir::Role::OptimizerStep);
}

parallel::Slice CompiledStep::share(std::size_t j) const {
  MINIDL_CHECK(j < micro_.size(), "micro-step ", j, " of ", micro_.size());
  const Micro& m = micro_[j];
  const parallel::Slice& own = programs_[m.program].share;
  return {m.samples.begin + own.begin, m.samples.begin + own.end};
}

std::span<CompiledStep::Part> CompiledStep::parts(std::size_t j) {
  MINIDL_CHECK(j < micro_.size(), "micro-step ", j, " of ", micro_.size());
  return programs_[micro_[j].program].parts;
}

std::span<const CompiledStep::Part> CompiledStep::parts(std::size_t j) const {
  MINIDL_CHECK(j < micro_.size(), "micro-step ", j, " of ", micro_.size());
  return programs_[micro_[j].program].parts;
}

std::vector<const ir::Graph*> CompiledStep::graphs() const {
  std::vector<const ir::Graph*> out;
  for (const Program& p : programs_) out.push_back(p.graph.get());
  if (apply_) out.push_back(apply_->graph.get());
  return out;
}

std::vector<const runtime::Executable*> CompiledStep::executables() const {
  std::vector<const runtime::Executable*> out;
  for (const Program& p : programs_) out.push_back(p.exe.get());
  if (apply_) out.push_back(apply_->exe.get());
  return out;
}

namespace {
void feed_step_inputs(Tensor& lr, Tensor& step, const StepFeed& feed) {
  if (lr.raw() != nullptr) *lr.data<float>() = static_cast<float>(feed.lr);
  if (step.raw() != nullptr) *step.data<std::int64_t>() = feed.step + 1;
}
}  // namespace

void CompiledStep::run(const StepFeed& feed) {
  MINIDL_CHECK(micro_.size() == 1, "this step has ", micro_.size(),
               " micro-steps: run it with a function that fills each");
  run(feed, [](std::size_t) {});
}

void CompiledStep::run(const StepFeed& feed, const std::function<void(std::size_t)>& fill) {
  loss_sum_ = 0.0;
  correct_ = 0;
  depth_ = 0;
  for (std::size_t j = 0; j < micro_.size(); ++j) {
    fill(j);
    run_micro(j, feed);
  }
  if (!apply_) return;
  MINIDL_ASSERT(depth_ == 1, "the micro-steps' sums left ", depth_, " partial sums");
  const float* sum = stack_[0].data();
  for (std::size_t i = 0; i < apply_grads_.size(); ++i) {
    std::memcpy(apply_grads_[i].data<float>(), sum + offsets_[i],
                static_cast<std::size_t>(offsets_[i + 1] - offsets_[i]) * sizeof(float));
  }
  feed_step_inputs(apply_->lr, apply_->step, feed);
  apply_->exe->run();
}

void CompiledStep::run_micro(std::size_t j, const StepFeed& feed) {
  Program& p = programs_[micro_[j].program];
  feed_step_inputs(p.lr, p.step, feed);
  if (p.rng_key.raw() != nullptr) {
    // Dropout masks follow the global step and each sample's place in the global batch, so
    // they are the same however the batch is split over ranks and micro-steps.
    p.rng_key.data<std::int64_t>()[0] = feed.step;
    p.rng_key.data<std::int64_t>()[1] = share(j).begin;
  }
  p.exe->run();
  if (p.loss == nullptr) return;  // a pipeline stage before the last
  // Checked every micro-step (one number): a run that diverged stops here, before anything
  // saves it.
  const float loss = p.exe->value(p.loss).at(0);
  MINIDL_CHECK(std::isfinite(loss), "the loss over this rank's ", p.share.size(), " samples is ",
               loss,
               check_numerics_ ? ""
                               : "; --check-numerics names the first node that produced a NaN "
                                 "or Inf");
  loss_sum_ += static_cast<double>(loss) * p.loss_to_sum;
  if (classification_) {
    for (const Part& part : p.parts) {
      if (part.predictions == nullptr) continue;
      const Tensor& probs = p.exe->value(part.predictions);
      const std::int64_t n = probs.shape()[0], c = probs.shape()[1];
      const float* pr = probs.data<float>();
      const std::int32_t* y = part.target.data<std::int32_t>();
      for (std::int64_t i = 0; i < n; ++i) correct_ += argmax(pr + i * c, c) == y[i];
    }
  }
  if (apply_) push_gradients(j);
}

// Pushes micro-step j's gradients (deterministic mode: joined across the ranks in its subtree)
// on the stack of partial sums, then joins the top two joins_[j] times.
void CompiledStep::push_gradients(std::size_t j) {
  Program& p = programs_[micro_[j].program];
  if (stack_.size() <= depth_) stack_.emplace_back(static_cast<std::size_t>(offsets_.back()));
  float* top = stack_[depth_++].data();
  for (std::size_t i = 0; i < p.grads.size(); ++i) {
    const Tensor& gr = p.exe->value(p.grads[i]);
    std::memcpy(top + offsets_[i], gr.data<float>(),
                static_cast<std::size_t>(gr.numel()) * sizeof(float));
  }
  if (p.tree) (*p.tree)(top);
  for (int k = 0; k < joins_[j]; ++k) {
    MINIDL_ASSERT(depth_ >= 2, "a join needs two partial sums");
    float* dst = stack_[depth_ - 2].data();
    const float* src = stack_[depth_ - 1].data();
    ops::elementwise(offsets_.back(), [&](std::int64_t lo, std::int64_t hi) {
#pragma omp simd
      for (std::int64_t i = lo; i < hi; ++i) dst[i] += src[i];
    });
    --depth_;
  }
}

MemoryUse CompiledStep::memory() const {
  MemoryUse m;
  std::set<const void*> params, state;
  std::set<const ir::Value*> grads;
  auto bytes = [](const ir::Value* v) {
    return v->shape().numel() * static_cast<std::int64_t>(dtype_size(v->dtype()));
  };
  for (const ir::Graph* g : graphs()) {
    for (const ir::Node* n : g->nodes()) {
      // A pipeline stage's graph keeps the other stages' parameters, unread.
      if (n->op() == "parameter" && !n->output()->users().empty() &&
          params.insert(n->bound().raw()).second)
        m.parameters += bytes(n->output());
      const std::optional<ir::UpdateRole>& role = n->def().update_role();
      // An update folded into its gradient product (ops::FuseUpdateIntoProduct) has no update
      // role and stores no gradient, but keeps the update's phase and reads its state.
      if (!role && !(n->phase() == ir::Phase::Update && n->def().has_side_effect())) continue;
      if (role) {
        // The gradient as the reduction handed it over: before the copies out of its bucket.
        const ir::Value* v = n->input(role->grad);
        while (v->producer()->op() == "bucket_unpack") v = v->producer()->input(0);
        if (grads.insert(v).second) m.gradients += bytes(v);
      }
      for (const ir::Value* in : n->inputs()) {
        if (in != nullptr && in->producer()->op() == "state" &&
            state.insert(in->producer()->bound().raw()).second)
          m.optimizer_state += bytes(in);
      }
    }
  }
  // ZeRO stage 1 allreduces every gradient whole in place, also those of the parameters of
  // which this rank updates no piece.
  for (const ir::Graph* g : graphs())
    for (const ir::Node* n : g->nodes())
      if (&n->def() == &parallel::op_zero_allreduce_into && grads.insert(n->output(1)).second)
        m.gradients += bytes(n->output(1));
  for (const runtime::Executable* exe : executables())
    m.activations += static_cast<std::int64_t>(exe->memory().planned_bytes);
  return m;
}

std::int64_t CompiledStep::correct() const {
  MINIDL_CHECK(classification_, "correct(): the loss does not classify");
  return correct_;
}

std::optional<double> CompiledStep::grad_norm() const {
  if (norm_ == nullptr) return std::nullopt;
  return static_cast<double>(norm_exe_->value(norm_).at(0));
}

}  // namespace minidl::train
