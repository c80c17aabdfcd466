// Measures whether overlapping the gradient reductions with the backward pass hides time. Not a
// test: an MLP with large layers is trained under mpirun in four set-ups, interleaved round by
// round in one process so that they share the machine's conditions:
//
//   compute   the training graph without the data-parallel pass (no communication)
//   blocking  overlap off: blocking allreduces after the whole backward
//   overlap   allreduce_start right after each bucket, allreduce_wait before its update, no polls
//   polled    the same with comm_progress nodes (MPI_Testsome) between the backward kernels
//
// and prints per set-up the median over rounds of the step time and of the time per step in
// each communication kernel (means over the ranks). hidden = blocking - polled (or overlap) step
// time; there is communication to hide = blocking - compute.
//
//   mpirun -np 2 minidl_overlap_probe [--hidden 2048] [--layers 3] [--batch 64] [--steps 5]
//       [--rounds 5] [--bucket BYTES]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "minidl/autograd/autograd.hpp"
#include "minidl/core/rng.hpp"
#include "minidl/core/threading.hpp"
#include "minidl/frontend/nn.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/runtime/executable.hpp"
#include "minidl/train/optimizer.hpp"

using namespace minidl;

namespace {

struct Args {
  std::int64_t hidden = 2048, layers = 3, batch = 64, steps = 5, rounds = 5;
  std::int64_t bucket = parallel::DataParallelOptions{}.bucket_bytes;
};

std::int64_t number(const std::string& flag, const std::string& v, std::int64_t least) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  MINIDL_CHECK(!v.empty() && *end == '\0' && n >= least, flag, ": expected an integer >= ", least,
               ", got '", v, "'");
  return n;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    MINIDL_CHECK(i + 1 < argc, flag, ": missing value");
    const std::string v = argv[++i];
    if (flag == "--hidden")
      a.hidden = number(flag, v, 1);
    else if (flag == "--layers")
      a.layers = number(flag, v, 1);
    else if (flag == "--batch")
      a.batch = number(flag, v, 1);
    else if (flag == "--steps")
      a.steps = number(flag, v, 1);
    else if (flag == "--rounds")
      a.rounds = number(flag, v, 1);
    else if (flag == "--bucket")
      a.bucket = number(flag, v, 0);
    else
      MINIDL_FAIL("unknown flag '", flag,
                  "' (known: --hidden --layers --batch --steps --rounds --bucket)");
  }
  return a;
}

struct Setup {
  std::string name;
  std::optional<parallel::DataParallelOptions> dp;  // none: no communication
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Sgd> sgd;
  Tensor lr = Tensor::full({}, 1e-4f);
  std::unique_ptr<ir::Graph> g;
  std::unique_ptr<runtime::Executable> exe;
  std::vector<double> step_ms;                           // per round
  std::map<std::string, std::vector<double>> kernel_ms;  // per op, per round
};

void build(Setup& s, const Args& a, parallel::Communicator& comm, std::int64_t local) {
  s.model = std::make_unique<nn::Sequential>();
  for (std::int64_t l = 0; l < a.layers; ++l) {
    s.model->emplace<nn::Linear>(fmt::format("fc{}", l + 1), a.hidden, a.hidden, nn::Init::He);
    s.model->emplace<nn::ReLU>(fmt::format("act{}", l + 1));
  }
  s.model->emplace<nn::Linear>("out", a.hidden, 10, nn::Init::Xavier);
  s.model->reset(1);
  s.sgd = std::make_unique<optim::Sgd>(optim::SgdOptions{.lr = 1e-4});
  s.g = std::make_unique<ir::Graph>();
  ir::Graph& g = *s.g;
  ir::Value* x = ops::input(g, "x", {local, a.hidden});
  ir::Value* labels = ops::input(g, "labels", {local}, DType::I32);
  ir::Value* loss = ops::softmax_cross_entropy((*s.model)(x), labels).first;
  g.add_output(loss);
  std::vector<ir::Value*> params;
  for (ir::Node* n : g.nodes())
    if (n->op() == "parameter") params.push_back(n->output());
  s.sgd->apply(g, params, autograd::differentiate(g, loss, params),
               {.lr = ops::state(g, "lr", s.lr)});
  ir::PassManager pm({"replicas-scheduled"});  // one graph, no thread replicas
  pm.add(std::make_unique<ir::DeadCodeElimination>());
  if (s.dp) pm.add(std::make_unique<parallel::DataParallel>(comm, 1.0 / comm.size(), *s.dp));
  pm.run(g);
  s.exe = std::make_unique<runtime::Executable>(g, runtime::CompileOptions{.profile = true});
  Tensor xs = s.exe->input("x");
  CounterRng(5).fill_normal(xs, static_cast<std::uint64_t>(comm.rank()), 0.0f, 1.0f);
  auto* y = s.exe->input("labels").data<std::int32_t>();
  for (std::int64_t i = 0; i < local; ++i) y[i] = static_cast<std::int32_t>(i % 10);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  parallel::Communicator& comm = parallel::world();
  const int p = comm.size();
  const std::int64_t local = a.batch / p;
  MINIDL_CHECK(local >= 1, "--batch ", a.batch, " is smaller than the ", p, " ranks");

  std::vector<Setup> setups;
  setups.push_back({"compute", std::nullopt});
  setups.push_back(
      {"blocking", parallel::DataParallelOptions{.bucket_bytes = a.bucket, .overlap = false}});
  setups.push_back({"overlap", parallel::DataParallelOptions{
                                   .bucket_bytes = a.bucket, .overlap = true, .progress = false}});
  setups.push_back({"polled", parallel::DataParallelOptions{
                                  .bucket_bytes = a.bucket, .overlap = true, .progress = true}});
  for (Setup& s : setups) {
    build(s, a, comm, local);
    s.exe->run();  // warm-up: first touch of every buffer
  }
  const std::vector<std::string> comm_ops = {"allreduce",     "allreduce_start", "allreduce_wait",
                                             "comm_progress", "bucket_pack",     "bucket_unpack"};
  for (std::int64_t round = 0; round < a.rounds; ++round) {
    for (Setup& s : setups) {
      std::map<std::string, double> before;
      for (const auto& k : s.exe->profile()) before[k.node->op()] += k.seconds;
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::int64_t i = 0; i < a.steps; ++i) s.exe->run();
      std::vector<double> v = {
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
      std::map<std::string, double> after;
      for (const auto& k : s.exe->profile()) after[k.node->op()] += k.seconds;
      for (const std::string& op : comm_ops) v.push_back(after[op] - before[op]);
      comm.allreduce_sum(v.data(), static_cast<std::int64_t>(v.size()));
      const double ms = 1e3 / static_cast<double>(p * a.steps);
      s.step_ms.push_back(v[0] * ms);
      for (std::size_t i = 0; i < comm_ops.size(); ++i)
        s.kernel_ms[comm_ops[i]].push_back(v[i + 1] * ms);
    }
  }
  if (comm.rank() == 0) {
    std::int64_t grad_bytes = 0;
    for (const auto& [name, t] : setups[0].model->parameters())
      grad_bytes += static_cast<std::int64_t>(t.nbytes());
    std::printf(
        "%d ranks x %d threads, %lld gradient bytes, bucket_bytes %lld, medians of %lld "
        "rounds of %lld steps, ms per step\n",
        p, max_threads(), static_cast<long long>(grad_bytes), static_cast<long long>(a.bucket),
        static_cast<long long>(a.rounds), static_cast<long long>(a.steps));
    for (Setup& s : setups) {
      std::printf("  %-9s step %8.2f", s.name.c_str(), median(s.step_ms));
      for (const std::string& op : comm_ops) {
        const double m = median(s.kernel_ms[op]);
        if (m > 0.0005) std::printf(" | %s %.2f", op.c_str(), m);
      }
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "minidl_overlap_probe: %s\n", e.what());
    return 1;
  }
}
