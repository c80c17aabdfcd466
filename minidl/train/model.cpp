#include "minidl/train/model.hpp"

#include <cctype>
#include <map>
#include <set>

#include "minidl/core/error.hpp"
#include "minidl/ops/ops.hpp"
#include "minidl/parallel/tensor_parallel.hpp"

namespace minidl::train {

std::string name_segment_problem(std::string_view segment) {
  if (segment.empty()) return "it is empty";
  for (std::size_t i = 0; i < segment.size(); ++i) {
    const auto c = static_cast<unsigned char>(segment[i]);
    if (c == '.') return "it contains '.', which joins the segments of a full name";
    if (std::isalnum(c) == 0 && c != '_') {
      const std::string shown = std::isprint(c) != 0 ? fmt::format("'{}'", static_cast<char>(c))
                                                     : fmt::format("byte {:#04x}", c);
      return fmt::format("it contains {} at offset {}; a name holds letters, digits and '_'", shown,
                         i);
    }
  }
  return {};
}

void check_names(Model& model) {
  std::set<std::string> seen;
  std::map<const void*, std::string> storage;  // whose tensor each storage is
  auto check = [&](const NamedTensors& tensors, const char* kind) {
    for (const auto& [name, t] : tensors) {
      std::size_t begin = 0;
      while (true) {
        const std::size_t dot = name.find('.', begin);
        const std::string_view segment =
            std::string_view(name).substr(begin, dot == std::string::npos ? dot : dot - begin);
        const std::string problem = name_segment_problem(segment);
        MINIDL_CHECK(problem.empty(), "model ", model.describe(), ": ", kind, " name '", name,
                     "' is not a dotted path of names: segment '", segment, "' is wrong (", problem,
                     ")");
        if (dot == std::string::npos) break;
        begin = dot + 1;
      }
      MINIDL_CHECK(seen.insert(name).second, "model ", model.describe(),
                   ": two tensors are named '", name, "'");
      // Two names for one storage would get two updates, and be saved twice.
      const auto [it, added] = storage.emplace(t.raw(), name);
      MINIDL_CHECK(added || t.raw() == nullptr, "model ", model.describe(), ": ", kind, " '", name,
                   "' is the tensor '", it->second, "' under another name");
    }
  };
  check(model.parameters(), "parameter");
  check(model.buffers(), "buffer");
}

void Model::shard_parameter(const std::string& name, const ParameterShard& shard) {
  MINIDL_FAIL(describe(), ": cannot store parameter '", name, "' as part ", shard.index, " of ",
              shard.count, " of ", shard.whole);
}

void Model::unshard_parameter(const std::string& name, const Tensor& whole) {
  MINIDL_FAIL(describe(), ": cannot store parameter '", name, "' whole (", whole.shape(), ")");
}

const ParameterShard* find_shard(const std::vector<std::pair<std::string, ParameterShard>>& shards,
                                 std::string_view name) {
  for (const auto& [n, s] : shards)
    if (n == name) return &s;
  return nullptr;
}

ir::Value* read_parameter(ir::Graph& g, const std::string& name, const Tensor& storage,
                          const ParameterShard* shard) {
  const ir::Node* n = g.find(name);
  ir::Value* v = n != nullptr ? n->output() : ops::parameter(g, name, storage);
  if (shard == nullptr) return v;
  if (const ir::Node* whole = g.find(name + ".whole")) return whole->output();
  ir::Value* whole = parallel::tp_gather(v, shard->axis, shard->group, name + ".whole");
  MINIDL_CHECK(whole->shape() == shard->whole, whole->producer()->describe(), ": gathers ",
               whole->shape(), " from the parts ", storage.shape(), " of parameter '", name,
               "', declared ", shard->whole);
  return whole;
}

}  // namespace minidl::train
