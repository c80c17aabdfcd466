#include "minidl/frontend/trace.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "minidl/core/error.hpp"
#include "minidl/io/file.hpp"

namespace minidl {
namespace {

constexpr int kTraceTag = 7301;

/// This rank's events as comma-separated JSON objects, times relative to origin.
std::string rank_events(const std::vector<TraceSpan>& spans, int rank, double origin) {
  std::string text;
  auto add = [&](const nlohmann::json& e) {
    if (!text.empty()) text += ",\n";
    text += e.dump();
  };
  add({{"ph", "M"},
       {"name", "process_name"},
       {"pid", rank},
       {"args", {{"name", fmt::format("rank {}", rank)}}}});
  add({{"ph", "M"},
       {"name", "process_sort_index"},
       {"pid", rank},
       {"args", {{"sort_index", rank}}}});
  std::set<int> threads;
  for (const TraceSpan& s : spans) threads.insert(s.thread);
  for (int t : threads) {
    add({{"ph", "M"},
         {"name", "thread_name"},
         {"pid", rank},
         {"tid", t},
         {"args", {{"name", fmt::format("thread {}", t)}}}});
  }
  for (const TraceSpan& s : spans) {
    nlohmann::json args{{"op", s.op}, {"kernel", s.kernel}};
    if (!s.waited_in.empty()) args["waited in"] = s.waited_in;
    if (s.flops > 0 && s.duration_us > 0) args["GFLOP/s"] = s.flops / s.duration_us * 1e-3;
    add({{"ph", "X"},
         {"name", s.name},
         {"cat", s.category},
         {"pid", rank},
         {"tid", s.thread},
         {"ts", s.begin_us - origin},
         {"dur", s.duration_us},
         {"args", std::move(args)}});
  }
  return text;
}

}  // namespace

std::size_t write_chrome_trace(const std::string& path, parallel::Communicator& comm,
                               const std::vector<TraceSpan>& spans) {
  const int ranks = comm.size();
  // The job's first event is time 0.
  double first = std::numeric_limits<double>::max();
  for (const TraceSpan& s : spans) first = std::min(first, s.begin_us);
  std::vector<double> firsts(static_cast<std::size_t>(ranks));
  comm.allgather(&first, firsts.data(), sizeof(double));
  const double origin = *std::min_element(firsts.begin(), firsts.end());
  const std::string mine =
      rank_events(spans, comm.rank(), origin == std::numeric_limits<double>::max() ? 0.0 : origin);

  const std::int64_t events = static_cast<std::int64_t>(spans.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(ranks)), counts(sizes.size());
  const std::int64_t size = static_cast<std::int64_t>(mine.size());
  comm.allgather(&size, sizes.data(), sizeof(size));
  comm.allgather(&events, counts.data(), sizeof(events));
  if (comm.rank() != 0) {
    comm.send(mine.data(), size, 0, kTraceTag);
    return 0;
  }
  std::string body = mine;
  for (int r = 1; r < ranks; ++r) {
    std::string text(static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]), '\0');
    comm.recv(text.data(), static_cast<std::int64_t>(text.size()), r, kTraceTag);
    body += ",\n" + text;
  }
  write_file_atomically(
      path, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" + body + "\n]}\n", "--trace");
  std::size_t total = 0;
  for (std::int64_t c : counts) total += static_cast<std::size_t>(c);
  return total;
}

}  // namespace minidl
