#include "minidl/frontend/checkpoint_shared.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>

#include "minidl/core/text.hpp"

namespace minidl::checkpoint {

Loaded load_shared(parallel::Communicator& comm, const std::string& path, const Tensors& into) {
  Loaded out;
  std::string text;
  if (comm.rank() == 0) {
    out = load(resolve(path), into);
    // The path may not be valid UTF-8, which JSON cannot hold: the other ranks name it escaped.
    text = nlohmann::json{{"path", utf8_escaped(out.path)}, {"metadata", out.metadata}}.dump();
  }
  if (comm.size() == 1) return out;
  std::int64_t size = static_cast<std::int64_t>(text.size());
  comm.broadcast(&size, sizeof size, 0);
  text.resize(static_cast<std::size_t>(size));
  comm.broadcast(text.data(), size, 0);
  for (const NamedTensors* group : {&into.parameters, &into.buffers, &into.optimizer_state}) {
    for (const auto& [name, t] : *group)
      comm.broadcast(t.raw(), static_cast<std::int64_t>(t.nbytes()), 0);
  }
  if (comm.rank() != 0) {
    const nlohmann::json j = nlohmann::json::parse(text);
    out.path = j.at("path").get<std::string>();
    out.metadata = j.at("metadata").get<Metadata>();
    out.position = position_from_metadata(out.path, out.metadata);
  }
  return out;
}

}  // namespace minidl::checkpoint
