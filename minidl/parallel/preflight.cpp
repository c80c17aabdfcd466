#include "minidl/parallel/preflight.hpp"

#include <sstream>
#include <vector>

namespace minidl::parallel {
namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

std::string fingerprint(const ir::Graph& g) {
  std::string s;
  for (const ir::Node* n : g.nodes()) {
    s += fmt::format("{} {}", n->op(), n->name());
    const bool communication = n->phase() == ir::Phase::Communication;
    const bool keep_shape = n->op() == "parameter" || n->op() == "state" || communication;
    if (keep_shape) {
      for (const ir::Value* v : n->outputs()) s += fmt::format(" {} {}", v->shape(), v->dtype());
    }
    // The reduction schedule: which collective, over which group, of which values. Not the
    // scale: it is the rank's share of the batch, which differs when the batch does not divide.
    if (communication) {
      for (const auto& [k, v] : n->attrs().items())
        if (k != "scale") s += fmt::format(" {}={}", k, ir::attr_to_string(v));
      for (const ir::Value* v : n->inputs()) s += fmt::format(" <{}", v->producer()->name());
    }
    s += '\n';
  }
  return s;
}

namespace {

/// Copies the string `s` of rank `from` to every rank (its length first).
std::string broadcast_string(Communicator& comm, const std::string& s, int from) {
  std::int64_t size = static_cast<std::int64_t>(s.size());
  comm.broadcast(&size, sizeof size, from);
  std::string out(static_cast<std::size_t>(size), '\0');
  if (comm.rank() == from) out = s;
  comm.broadcast(out.data(), size, from);
  return out;
}

std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

void preflight(Communicator& comm, const std::string& description, const std::string& error,
               int exit_code) {
  if (comm.size() == 1) {
    if (!error.empty()) throw PreflightError(error, exit_code);
    return;
  }
  // Per rank: the description's hash, whether it failed, and the status it asks for.
  const std::int64_t mine[3] = {static_cast<std::int64_t>(fnv1a(description)),
                                error.empty() ? 0 : 1, exit_code};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(comm.size()));
  comm.allgather(mine, all.data(), sizeof mine);
  auto at = [&](int r, int k) { return all[3 * static_cast<std::size_t>(r) + k]; };

  std::vector<int> failed, differ;
  for (int r = 0; r < comm.size(); ++r) {
    if (at(r, 1) != 0) failed.push_back(r);
    if (at(r, 0) != at(0, 0)) differ.push_back(r);
  }
  if (!failed.empty()) {
    const int first = failed.front();
    const std::string what = broadcast_string(comm, error, first);
    throw PreflightError(
        fmt::format("rank(s) {} of {} could not start: {}", list(failed), comm.size(), what),
        static_cast<int>(at(first, 2)));
  }
  if (differ.empty()) return;

  // Rank 0's description goes to everyone; the first differing rank names its first difference
  // and tells the others, so every rank reports the same.
  const std::string root = broadcast_string(comm, description, 0);
  const int first = differ.front();
  std::string detail;
  if (comm.rank() == first) {
    const auto a = lines(root), b = lines(description);
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    detail = fmt::format("first difference (rank {}) at item {}: rank 0 has '{}', rank {} has '{}'",
                         first, i + 1, i < a.size() ? a[i] : "<end>", first,
                         i < b.size() ? b[i] : "<end>");
  }
  detail = broadcast_string(comm, detail, first);
  throw PreflightError(fmt::format("preflight: the training set-up of rank(s) {} differs from "
                                   "rank 0's; {}",
                                   list(differ), detail),
                       1);
}

}  // namespace minidl::parallel
