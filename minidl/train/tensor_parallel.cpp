#include "minidl/train/tensor_parallel.hpp"

#include <algorithm>
#include <string>

#include "minidl/ops/ops.hpp"
#include "minidl/parallel/tensor_parallel.hpp"

namespace minidl::train {
namespace {

const Tensor* find(const NamedTensors& ts, const std::string& key) {
  const auto it = std::find_if(ts.begin(), ts.end(), [&](const auto& t) { return t.first == key; });
  return it == ts.end() ? nullptr : &it->second;
}

}  // namespace

void shard_split_parameters(Model& model, const Shape& sample, parallel::Communicator& shards) {
  // The split, found on a graph of the model's forward (gone, with the handles of the whole
  // tensors it binds, before this returns).
  ir::Graph scratch;
  std::vector<std::int64_t> dims{1};
  dims.insert(dims.end(), sample.dims().begin(), sample.dims().end());
  model.forward(ops::input(scratch, "x", Shape(dims)));
  const std::vector<parallel::SplitParameter> split = parallel::plan_split(scratch, shards.size());
  for (const parallel::SplitParameter& p : split) {
    Shape whole;
    for (const auto& [name, t] : model.parameters())
      if (name == p.name) whole = t.shape();
    MINIDL_CHECK(whole.rank() > 0, "--tensor-parallel: '", p.name, "' is not a parameter of ",
                 model.describe());
    model.shard_parameter(p.name, {.whole = whole,
                                   .axis = p.axis,
                                   .index = shards.rank(),
                                   .count = shards.size(),
                                   .group = parallel::register_group(&shards)});
  }
}

NamedTensors gather_parameters(Model& model) {
  const auto shards = model.parameter_shards();
  NamedTensors out;
  for (const auto& [name, t] : model.parameters()) {
    const ParameterShard* s = find_shard(shards, name);
    out.emplace_back(
        name, s == nullptr ? t : parallel::gather_pieces(parallel::group(s->group), t, s->whole));
  }
  return out;
}

void load_parameters(Model& model, const NamedTensors& whole) {
  const auto shards = model.parameter_shards();
  for (const auto& [name, t] : model.parameters()) {
    const Tensor* w = find(whole, name);
    MINIDL_CHECK(w != nullptr, "no tensor '", name, "' to load into the model's parameter");
    if (w->raw() == t.raw()) continue;
    const ParameterShard* s = find_shard(shards, name);
    MINIDL_CHECK(w->shape() == (s ? s->whole : t.shape()), "parameter '", name, "' is ",
                 s ? s->whole : t.shape(), ", the tensor to load ", w->shape());
    Tensor(t).copy_from(s == nullptr ? *w
                                     : parallel::take_piece(*w, t.shape(), s->index, s->count));
  }
}

void unshard_parameters(Model& model) {
  const auto shards = model.parameter_shards();
  if (shards.empty()) return;
  const NamedTensors whole = gather_parameters(model);
  for (const auto& [name, s] : shards) model.unshard_parameter(name, *find(whole, name));
}

NamedTensors whole_state(const NamedTensors& own, Model& model, parallel::Communicator& shards) {
  const auto split = model.parameter_shards();
  NamedTensors out;
  for (const auto& [key, t] : own) {
    const ParameterShard* s = find_shard(split, key.substr(0, key.rfind('.')));
    out.emplace_back(key, s == nullptr ? t : parallel::gather_pieces(shards, t, s->whole));
  }
  return out;
}

void load_state_pieces(const NamedTensors& own, const NamedTensors& whole,
                       parallel::Communicator& shards) {
  for (const auto& [key, t] : own) {
    const Tensor* w = find(whole, key);
    MINIDL_CHECK(w != nullptr, "--tensor-parallel: no optimizer state '", key, "' to load");
    if (w->raw() == t.raw()) continue;
    Tensor(t).copy_from(w->shape() == t.shape()
                            ? *w
                            : parallel::take_piece(*w, t.shape(), shards.rank(), shards.size()));
  }
}

}  // namespace minidl::train
