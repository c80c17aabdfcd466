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

void preflight(Communicator& comm, const std::string& description) {
  if (comm.size() == 1) return;
  const std::uint64_t mine = fnv1a(description);
  std::vector<std::uint64_t> all(comm.size());
  comm.allgather(&mine, all.data(), sizeof mine);
  std::vector<int> differ;
  for (int r = 1; r < comm.size(); ++r)
    if (all[r] != all[0]) differ.push_back(r);
  if (differ.empty()) return;

  // Rank 0's description goes to everyone, so each differing rank can name its first difference.
  std::int64_t size = static_cast<std::int64_t>(description.size());
  comm.broadcast(&size, sizeof size, 0);
  std::string root(static_cast<std::size_t>(size), '\0');
  if (comm.rank() == 0) root = description;
  comm.broadcast(root.data(), size, 0);

  std::string ranks;
  for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  std::string detail;
  if (all[comm.rank()] != all[0]) {
    const auto a = lines(root), b = lines(description);
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    detail = fmt::format("; first difference at item {}: rank 0 has '{}', rank {} has '{}'", i + 1,
                         i < a.size() ? a[i] : "<end>", comm.rank(), i < b.size() ? b[i] : "<end>");
  }
  MINIDL_FAIL("preflight: the training set-up of rank(s) ", ranks, " differs from rank 0's",
              detail);
}

}  // namespace minidl::parallel
