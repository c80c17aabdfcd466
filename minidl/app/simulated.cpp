#include "minidl/app/simulated.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "minidl/core/error.hpp"
#include "minidl/core/text.hpp"
#include "minidl/parallel/communicator.hpp"

#ifdef MINIDL_SIMGRID
#include <mpi.h>

#include "minidl/app/simulated_store.hpp"
#endif

namespace minidl {

void apply_simulated_rules(AppConfig& c) {
  MINIDL_CHECK(c.compute_table.empty() || parallel::simulated(),
               "--compute-table applies to a simulated run only (a build with "
               "-DMINIDL_SIMGRID=ON under smpirun, see scripts/simulate-cluster): this build runs "
               "its kernels");
  if (!parallel::simulated()) return;
  MINIDL_CHECK(c.threads == 0 || c.threads == 1, "--threads ", c.threads,
               ": a simulated run (SimGrid SMPI, MPI_THREAD_SINGLE) has one thread per rank; "
               "use --threads 1 and more ranks per node");
  MINIDL_CHECK(c.collective_timeout == 0.0,
               "--collective-timeout does not apply to a simulated run (SimGrid SMPI): the "
               "simulator ends a run that deadlocks itself");
  // SMPI 3.32's non-blocking allreduce in place returned wrong sums on several ranks.
  MINIDL_CHECK(!c.overlap,
               "--overlap does not apply to a simulated run (SimGrid SMPI): its non-blocking "
               "allreduce is not reliable there; simulate without it");
  c.threads = 1;
  // The ranks share one real thread, which the simulator times between MPI calls: a prefetch
  // thread would do its work outside both.
  c.no_prefetch = true;
}

DatasetSplits simulated_shared_data(const AppConfig& c, const std::string& dir,
                                    const std::function<DatasetSplits()>& make) {
#ifdef MINIDL_SIMGRID
  // Everything make() reads from the flags.
  const std::string key =
      fmt::format("data {} {} train {} test {} upscale {} normalize {}", c.dataset, dir,
                  c.train_limit, c.test_limit, c.upscale, c.normalize);
  if (std::shared_ptr<void> kept = simulated_store_get(key))
    return *static_cast<const DatasetSplits*>(kept.get());
  auto made = std::make_shared<DatasetSplits>(make());
  simulated_store_put(key, made);
  return *made;
#else
  (void)c;
  (void)dir;
  return make();
#endif
}

namespace {
#ifdef MINIDL_SIMGRID

/// Per node: (elements, seconds per call) points, sorted by elements.
using ComputeTable = std::map<std::string, std::vector<std::pair<double, double>>, std::less<>>;

ComputeTable read_compute_table(const std::string& path) {
  std::ifstream in(path);
  MINIDL_CHECK(in.good(), "--compute-table '", printable(path), "': cannot read it (",
               std::strerror(errno), ")");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    MINIDL_FAIL("--compute-table '", printable(path), "': not JSON (", e.what(), ")");
  }
  MINIDL_CHECK(
      j.is_object() && j.contains("nodes") && j["nodes"].is_object() && !j["nodes"].empty(),
      "--compute-table '", printable(path),
      "': expected {\"nodes\": {NAME: [[ELEMENTS, SECONDS], ...], ...}} with at least one "
      "node");
  ComputeTable table;
  for (const auto& [name, points] : j["nodes"].items()) {
    auto& mine = table[name];
    const bool listed = points.is_array() && !points.empty();
    for (std::size_t i = 0; listed && i < points.size(); ++i) {
      const auto& p = points[i];
      MINIDL_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number() &&
                       p[0].get<double>() >= 0 && p[1].get<double>() >= 0,
                   "--compute-table '", printable(path), "': node '", printable(name), "': point ",
                   i, " is ", p.dump(), ", expected [ELEMENTS, SECONDS], both >= 0");
      mine.emplace_back(p[0].get<double>(), p[1].get<double>());
    }
    MINIDL_CHECK(listed, "--compute-table '", printable(path), "': node '", printable(name),
                 "' has ", points.dump(), ", expected a list of [ELEMENTS, SECONDS] points");
    std::sort(mine.begin(), mine.end());
  }
  return table;
}

/// The points' time at x elements: linear between the two points around x, or along the
/// nearest two beyond them; the mean of points measured at one size; never below 0.
double interpolate(const std::vector<std::pair<double, double>>& pts, double x) {
  std::size_t hi = 1;
  while (hi + 1 < pts.size() && pts[hi].first < x) ++hi;
  if (pts.size() == 1 || pts.front().first == pts.back().first) {
    double sum = 0.0;
    for (const auto& p : pts) sum += p.second;
    return sum / static_cast<double>(pts.size());
  }
  std::size_t lo = hi - 1;
  while (lo > 0 && pts[lo].first == pts[hi].first) --lo;
  if (pts[lo].first == pts[hi].first) return pts[hi].second;
  const double t = (x - pts[lo].first) / (pts[hi].first - pts[lo].first);
  return std::max(0.0, pts[lo].second + t * (pts[hi].second - pts[lo].second));
}

constexpr std::size_t kSharedBytes = std::size_t{64} << 10;

void* simulated_allocate(std::size_t bytes) {
  if (bytes >= kSharedBytes) return smpi_shared_malloc(bytes, __FILE__, __LINE__);
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (p != nullptr) std::memset(p, 0, bytes);
  return p;
}

void simulated_release(void* data, std::size_t bytes) {
  if (bytes >= kSharedBytes) {
    smpi_shared_free(data);
  } else {
    std::free(data);
  }
}

const StorageAllocator kSimulatedAllocator{simulated_allocate, simulated_release};
#endif

}  // namespace

std::shared_ptr<const runtime::InjectedCompute> simulated_compute(const AppConfig& c) {
  if (c.compute_table.empty()) return nullptr;
#ifdef MINIDL_SIMGRID
  // Every simulated rank reads the same table: the first one's is kept for the others.
  const std::string key = "compute table " + c.compute_table;
  std::shared_ptr<const ComputeTable> table =
      std::static_pointer_cast<const ComputeTable>(simulated_store_get(key));
  if (!table) {
    auto made = std::make_shared<const ComputeTable>(read_compute_table(c.compute_table));
    simulated_store_put(key, std::const_pointer_cast<ComputeTable>(made));
    table = made;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto named = std::make_shared<std::set<std::string>>();  // the nodes said to be missing
  auto injected = std::make_shared<runtime::InjectedCompute>();
  injected->seconds = [table, named, rank, path = c.compute_table](const ir::Node& n) {
    auto it = table->find(n.name());
    if (it == table->end()) {
      if (rank == 0 && named->insert(n.name()).second)
        std::fprintf(stderr, "note: --compute-table '%s' has no time for %s: it takes none\n",
                     printable(path).c_str(), n.describe().c_str());
      return 0.0;
    }
    return interpolate(it->second, static_cast<double>(runtime::node_elements(n)));
  };
  injected->spend = [](double seconds) {
    if (seconds > 0) smpi_execute(seconds);
  };
  set_storage_allocator(&kSimulatedAllocator);
  return injected;
#else
  return nullptr;  // refused by apply_simulated_rules
#endif
}

}  // namespace minidl
