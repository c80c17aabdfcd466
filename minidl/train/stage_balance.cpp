#include "minidl/train/stage_balance.hpp"

#include <cstring>
#include <utility>
#include <vector>

#include "minidl/core/error.hpp"

namespace minidl::train {

NodeSeconds attribute_to_forward(const std::vector<runtime::KernelProfile>& profile, int runs) {
  NodeSeconds table;
  for (const runtime::KernelProfile& k : profile) {
    const ir::Node& n = *k.node;
    if (n.phase() == ir::Phase::Update) {
      // An update counts for its parameter (the stage that holds it runs it).
      if (const auto& role = n.def().update_role())
        table[n.input(static_cast<std::size_t>(role->param))->producer()->name()] +=
            k.seconds / std::max(runs, 1);
      continue;
    }
    if (n.phase() == ir::Phase::Communication || n.def().comm_role() != ir::CommRole::None ||
        n.def().is_source())
      continue;
    // A fused node is named after the first node it holds ("conv2.conv2d+bias+relu"), a
    // backward node after its forward node ("fc1.matmul.bwd", "fc1.matmul.bwd.1").
    std::string name = n.name().substr(0, n.name().find('+'));
    for (std::size_t at = name.find(".bwd"); at != std::string::npos;
         at = name.find(".bwd", at + 1))
      if (at + 4 == name.size() || name[at + 4] == '.') {
        name.resize(at);
        break;
      }
    table[name] += k.seconds / std::max(runs, 1);
  }
  return table;
}

namespace {

// The table of this process's own profiled steps (see profile_forward); an error goes to *error.
NodeSeconds profile_locally(Model& model, const Loss& loss, optim::Optimizer& optimizer,
                            const Shape& sample, std::int64_t micro, const StepOptions& options,
                            int steps, std::string* error) {
  // What a step changes: the parameters, the buffers (running statistics) and the optimizer's
  // state (its own, fresh, during the profile).
  std::vector<std::pair<Tensor, Tensor>> saved;
  for (auto& [name, t] : model.parameters()) saved.emplace_back(t, t.clone());
  for (auto& [name, t] : model.buffers()) saved.emplace_back(t, t.clone());
  NamedTensors state = optimizer.exchange_state({});
  NodeSeconds table;
  try {
    StepOptions o = options;
    o.pipeline = {};
    o.zero = 0;
    o.clip_grad_norm = 0.0;
    o.sync_batch_stats = false;
    // One micro-batch as one micro-shard: its kernels on one thread, as a stage runs them.
    o.layout = parallel::Layout({.micro_batch = micro});
    o.compile.profile = true;
    o.compile.trace = false;
    auto local = parallel::make_local_communicator();
    o.comm = local.get();
    o.tensor_comm = nullptr;
    CompiledStep step =
        compile_step(model, loss, &optimizer, {.sample = sample, .batch = micro}, o);
    for (CompiledStep::Part& p : step.parts()) {
      std::memset(p.x.raw(), 0, p.x.nbytes());
      std::memset(p.target.raw(), 0, p.target.nbytes());
    }
    // Each kernel's least time over the steps after the first (a warm-up): a process that
    // is descheduled inside a kernel (a loaded machine) does not make that kernel look slow.
    auto totals = [&] {
      std::vector<runtime::KernelProfile> all;
      for (const runtime::Executable* exe : step.executables())
        all.insert(all.end(), exe->profile().begin(), exe->profile().end());
      return all;
    };
    step.run({.lr = 0.0, .step = 0});
    std::vector<runtime::KernelProfile> before = totals(), least;
    for (int i = 1; i < std::max(steps, 2); ++i) {
      step.run({.lr = 0.0, .step = 0});
      std::vector<runtime::KernelProfile> now = totals();
      if (least.empty()) least = now;
      for (std::size_t j = 0; j < now.size(); ++j) {
        const double took = now[j].seconds - before[j].seconds;
        least[j].seconds = i == 1 ? took : std::min(least[j].seconds, took);
      }
      before = std::move(now);
    }
    table = attribute_to_forward(least, 1);
  } catch (const Error& e) {
    *error = e.what();
  }
  for (auto& [t, copy] : saved) t.copy_from(copy);
  optimizer.exchange_state(std::move(state));
  return table;
}

}  // namespace

NodeSeconds profile_forward(Model& model, const Loss& loss, optim::Optimizer& optimizer,
                            const Shape& sample, std::int64_t micro, const StepOptions& options,
                            parallel::Communicator& comm, int steps) {
  // Rank 0 profiles and the others take its table: every rank cuts alike, and the profile is
  // not disturbed by the other ranks profiling at once (they wait in the broadcast).
  NodeSeconds table;
  std::string error;
  if (comm.rank() == 0) {
    table = profile_locally(model, loss, optimizer, sample, micro, options, steps, &error);
  }
  // Rank 0's table on every rank, or its error when its profile failed.
  std::string text;
  if (!error.empty()) {
    text = "!" + error;
  } else {
    for (const auto& [name, s] : table) text += fmt::format("{}\t{:a}\n", name, s);
  }
  std::int64_t size = static_cast<std::int64_t>(text.size());
  comm.broadcast(&size, sizeof(size), 0);
  text.resize(static_cast<std::size_t>(size));
  if (size > 0) comm.broadcast(text.data(), size, 0);
  MINIDL_CHECK(text.empty() || text[0] != '!', "pipeline: profiling a step to balance the stages: ",
               text.substr(text.empty() ? 0 : 1));
  table.clear();
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t tab = text.find('\t', at), end = text.find('\n', at);
    table[text.substr(at, tab - at)] =
        std::strtod(text.substr(tab + 1, end - tab - 1).c_str(), nullptr);
    at = end + 1;
  }
  return table;
}

}  // namespace minidl::train
