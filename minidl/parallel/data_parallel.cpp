#include "minidl/parallel/data_parallel.hpp"

#include <algorithm>
#include <unordered_map>

#include "minidl/core/log.hpp"
#include "minidl/ops/registry.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/op_table.hpp"

namespace minidl::parallel {

std::string_view reduce_strategy_name(ReduceStrategy s) {
  switch (s) {
    case ReduceStrategy::Allreduce:
      return "allreduce";
    case ReduceStrategy::Root:
      return "root";
    case ReduceStrategy::Hierarchical:
      return "hierarchical";
    case ReduceStrategy::Tree:
      return "tree";
  }
  return "?";
}

ReduceStrategy parse_reduce_strategy(std::string_view s) {
  for (auto r : {ReduceStrategy::Allreduce, ReduceStrategy::Root, ReduceStrategy::Hierarchical,
                 ReduceStrategy::Tree})
    if (reduce_strategy_name(r) == s) return r;
  MINIDL_FAIL("unknown reduce strategy '", s, "' (expected allreduce, root, hierarchical or tree)");
}

namespace {
int int_annotation(const ir::Node& n, std::string_view key) {
  const ir::AttrValue* v = n.annotations().find(key);
  if (v == nullptr) return 0;
  const auto* i = std::get_if<std::int64_t>(v);
  MINIDL_CHECK(i != nullptr, n.describe(), ": annotation '", key, "' must be an int, got ",
               ir::attr_to_string(*v));
  return static_cast<int>(*i);
}
}  // namespace

int stage_of(const ir::Node& n) { return int_annotation(n, "stage"); }
int shard_of(const ir::Node& n) { return int_annotation(n, "shard"); }
void set_stage(ir::Node& n, int stage) { n.annotations().set("stage", std::int64_t{stage}); }
void set_shard(ir::Node& n, int shard) { n.annotations().set("shard", std::int64_t{shard}); }

DataParallel::DataParallel(Communicator& comm, double share, DataParallelOptions options)
    : comm_(comm), group_(register_group(&comm)), share_(share), options_(options) {
  MINIDL_CHECK(share > 0.0 && share <= 1.0,
               "data-parallel: a rank's share of the batch must be in "
               "(0, 1], got ",
               share);
  MINIDL_CHECK(options.bucket_bytes >= 0, "data-parallel: bucket bytes must be >= 0, got ",
               options.bucket_bytes);
  if (options.strategy == ReduceStrategy::Tree) {
    MINIDL_CHECK(!options.overlap,
                 "data-parallel: the tree reduction is blocking; overlap is not available with it");
    MINIDL_CHECK(options.tree_leaves >= comm.size(), "data-parallel: a tree over ",
                 options.tree_leaves, " micro-shard(s) cannot give each of the ", comm.size(),
                 " ranks one");
  }
  comm_.split_shared(options.ranks_per_node);
}

namespace {

// One gradient to reduce: the value as autograd produced it and the updates that read it.
struct Grad {
  ir::Value* value = nullptr;
  std::vector<ir::Node*> updates;
  std::string param;  // the parameter's name, for the names of the nodes added for it
  std::int64_t bytes = 0;
  int produced_at = 0;
};

struct Bucket {
  std::vector<Grad*> members;
  std::int64_t bytes = 0;
};

bool is_communication(const ir::Node& n) { return n.phase() == ir::Phase::Communication; }
bool is_wait(const ir::Node& n) { return n.def().comm_role() == ir::CommRole::Wait; }

std::unordered_map<const ir::Node*, int> positions(const ir::Graph& g) {
  std::unordered_map<const ir::Node*, int> pos;
  for (const ir::Node* n : g.nodes()) pos[n] = static_cast<int>(pos.size());
  return pos;
}

// Moves node to right after the latest of anchors in the current order.
void put_after(ir::Graph& g, ir::Node* node, std::initializer_list<const ir::Node*> anchors) {
  const auto& order = g.nodes();
  auto last = order.begin();
  for (const ir::Node* a : anchors) last = std::max(last, std::find(order.begin(), order.end(), a));
  MINIDL_ASSERT(last != order.end());
  auto next = last + 1;
  MINIDL_ASSERT(next != order.end(), "nothing follows ", (*last)->describe());
  if (*next != node) g.move_before(node, *next);
}

// The earliest of nodes in the current order.
ir::Node* earliest(const ir::Graph& g, const std::vector<ir::Node*>& nodes) {
  const auto pos = positions(g);
  return *std::min_element(nodes.begin(), nodes.end(),
                           [&](ir::Node* a, ir::Node* b) { return pos.at(a) < pos.at(b); });
}

ir::Node* mark(ir::Node* n, int bucket) {
  n->set_phase(ir::Phase::Communication);
  if (bucket >= 0) n->annotations().set("bucket", std::int64_t{bucket});
  return n;
}
ir::Value* mark(ir::Value* v, int bucket) {
  mark(v->producer(), bucket);
  return v;
}

// An in-place collective on a value that shares another value's storage (an alias, another
// op's in-place output) would overwrite that value too: such a gradient is copied into a bucket.
bool shares_storage(const ir::Value* v) {
  const ir::Node* p = v->producer();
  return p->def().is_source() || p->def().shares_input(v->index()) >= 0;
}

}  // namespace

bool DataParallel::run(ir::Graph& g) {
  const Partition& part = options_.partition;
  // Pipeline stages: the graph holds one stage, and the communicator is that stage's replicas,
  // so its gradients are reduced over them only. Tensor shards: each rank holds one shard, and
  // the communicator is the replicas of that shard. Not both at once.
  MINIDL_CHECK(part.stages >= 1 && part.shards >= 1 && (part.stages == 1 || part.shards == 1),
               "data-parallel: a partition into ", part.stages, " stages x ", part.shards,
               " shards is not implemented (pipeline stages or tensor-parallel shards, not both)");
  const int stage = g.nodes().empty() ? 0 : stage_of(*g.nodes().front());
  for (const ir::Node* n : g.nodes()) {
    MINIDL_CHECK(stage_of(*n) == stage && stage < part.stages && shard_of(*n) < part.shards,
                 n->describe(), ": stage ", stage_of(*n), ", shard ", shard_of(*n),
                 " lies outside the partition (", part.stages, " stage(s), ", part.shards,
                 " shard(s), one stage per graph)");
  }

  // Match first: every update's gradient input, in the order the gradients become final. A node
  // that writes a parameter in place without declaring itself an update would keep each rank's
  // own gradient, and the ranks would drift apart: refused.
  auto pos = positions(g);
  std::vector<Grad> grads;
  std::vector<ir::Node*> updates;
  for (ir::Node* n : g.nodes()) {
    const std::optional<ir::UpdateRole>& role = n->def().update_role();
    if (!role) {
      for (std::size_t o = 0; o < n->outputs().size(); ++o) {
        const int in = n->def().shares_input(static_cast<int>(o));
        MINIDL_CHECK(in < 0 || n->def().is_alias() || n->input(in)->producer()->op() != "parameter",
                     "data-parallel: ", n->describe(), " writes parameter '",
                     n->input(in)->producer()->name(),
                     "' in place but its op declares no update role (OpDef::update(param, grad)), "
                     "so its gradient would not be reduced across ranks");
      }
      continue;
    }
    updates.push_back(n);
    ir::Value* v = n->input(role->grad);
    auto known =
        std::find_if(grads.begin(), grads.end(), [&](const Grad& x) { return x.value == v; });
    if (known != grads.end()) {
      known->updates.push_back(n);
      continue;
    }
    MINIDL_CHECK(v->dtype() == DType::F32, n->describe(), ": gradient ", v->ref(), " is ",
                 v->dtype(), ", the data-parallel pass reduces f32 only");
    const ir::Value* param = n->input(role->param);
    grads.push_back({v,
                     {n},
                     param->producer()->name(),
                     v->shape().numel() * static_cast<std::int64_t>(sizeof(float)),
                     pos.at(v->producer())});
  }
  schedule_.clear();
  if (grads.empty()) return false;
  std::stable_sort(grads.begin(), grads.end(),
                   [](const Grad& a, const Grad& b) { return a.produced_at < b.produced_at; });

  std::vector<Bucket> buckets;
  for (Grad& gr : grads) {
    const bool fits = !buckets.empty() && options_.bucket_bytes > 0 &&
                      buckets.back().bytes + gr.bytes <= options_.bucket_bytes;
    if (!fits) buckets.emplace_back();
    buckets.back().members.push_back(&gr);
    buckets.back().bytes += gr.bytes;
  }

  const ReduceStrategy strategy = options_.strategy;
  const Communicator::SharedSplit& split = comm_.split_shared(options_.ranks_per_node);
  const int node_group = register_group(split.node);
  const int leaders_group = register_group(split.leaders);
  ir::Node* const first_update = updates.front();
  const bool overlap = options_.overlap;
  schedule_ =
      fmt::format("strategy {}, bucket_bytes {}, overlap {}\n", reduce_strategy_name(strategy),
                  options_.bucket_bytes, overlap ? "on" : "off");

  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& bucket = buckets[k];
    const int b = static_cast<int>(k);
    const std::string prefix = fmt::format("bucket{}", k);
    const bool packed = bucket.members.size() > 1 || shares_storage(bucket.members[0]->value);

    // The value to reduce: the gradient itself, in place, or a flat bucket the gradients are
    // copied into as soon as each is final.
    ir::Value* v = nullptr;
    std::vector<ir::Node*> packs;
    if (packed) {
      ir::Node* fill =
          mark(g.add_node(ops::op("fill"), {}, {{"shape", ir::Ints{bucket.bytes / 4}}}, prefix), b);
      v = fill->output();
      std::int64_t offset = 0;
      const ir::Node* prev = nullptr;
      for (Grad* m : bucket.members) {
        v = mark(bucket_pack(v, m->value, offset, prefix + ".pack." + m->param), b);
        ir::Node* p = v->producer();
        if (prev)
          put_after(g, p, {m->value->producer(), prev});
        else
          put_after(g, p, {m->value->producer()});
        if (!prev) g.move_before(fill, p);
        prev = p;
        packs.push_back(p);
        offset += m->value->shape().numel();
      }
    } else {
      v = bucket.members[0]->value;
    }
    ir::Node* ready = packed ? packs.back() : v->producer();

    // The collectives. Early ones go right after the bucket is complete, late ones right before
    // the first update that reads the bucket (overlap) or after the whole backward (no overlap).
    std::vector<ir::Node*> early, late;
    std::vector<std::string> steps;
    auto add_early = [&](ir::Value* out) {
      early.push_back(mark(out->producer(), b));
      steps.push_back(out->producer()->op());
      return out;
    };
    auto add_late = [&](ir::Value* out) {
      late.push_back(mark(out->producer(), b));
      steps.push_back(out->producer()->op());
      return out;
    };
    auto early_or_late = [&](ir::Value* out) { return overlap ? add_early(out) : add_late(out); };
    switch (strategy) {
      case ReduceStrategy::Allreduce:
        if (overlap) {
          const InFlight f = allreduce_start(v, share_, group_, prefix + ".allreduce_start");
          add_early(f.data);
          v = add_late(allreduce_wait(f, prefix + ".allreduce_wait"));
        } else {
          v = add_late(allreduce(v, share_, group_, prefix + ".allreduce"));
        }
        break;
      case ReduceStrategy::Root:
        v = early_or_late(reduce(v, share_, 0, group_, prefix + ".reduce"));
        break;
      case ReduceStrategy::Hierarchical:
        if (!overlap) {
          v = add_late(hierarchical_allreduce(v, share_, group_, options_.ranks_per_node,
                                              prefix + ".hierarchical_allreduce"));
          break;
        }
        v = add_early(reduce(v, share_, 0, node_group, prefix + ".node_reduce"));
        {
          const InFlight f = allreduce_start(v, 1.0, leaders_group, prefix + ".leaders_start");
          add_early(f.data);
          v = add_late(allreduce_wait(f, prefix + ".leaders_wait"));
        }
        v = add_late(broadcast(v, 0, node_group, prefix + ".node_broadcast"));
        break;
      case ReduceStrategy::Tree:
        v = add_late(tree_allreduce(v, options_.tree_leaves, group_, prefix + ".tree_allreduce",
                                    options_.tree_by_node, options_.ranks_per_node));
        break;
    }
    const ir::Node* after = ready;
    for (ir::Node* n : early) {
      put_after(g, n, {after});
      after = n;
    }
    std::vector<ir::Node*> readers;
    for (Grad* m : bucket.members)
      readers.insert(readers.end(), m->updates.begin(), m->updates.end());
    ir::Node* before = overlap ? earliest(g, readers) : first_update;
    for (ir::Node* n : late) g.move_before(n, before);

    // Every update now reads the reduced gradient.
    std::string members;
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < bucket.members.size(); ++i) {
      Grad* m = bucket.members[i];
      members += (members.empty() ? "" : ", ") + m->param;
      if (!packed) {
        g.replace_uses(m->value, v, (early.empty() ? late : early).front());
        continue;
      }
      ir::Value* u =
          mark(bucket_unpack(v, offset, m->value->shape(), prefix + ".unpack." + m->param), b);
      g.move_before(u->producer(), earliest(g, m->updates));
      g.replace_uses(m->value, u, packs[i]);
      offset += m->value->shape().numel();
    }
    schedule_ += fmt::format("bucket {}: {} bytes, {}{}: {}\n", k, bucket.bytes,
                             packed ? "bucket_pack -> " : "", fmt::join(steps, " -> "), members);
  }

  // Root: rank 0 alone has the reduced gradients, so its updated parameters are the result.
  if (strategy == ReduceStrategy::Root) {
    for (ir::Node* u : updates) {
      const int slot = u->def().update_role()->param;
      const ir::Node* after = u;
      for (std::size_t i = 0; i < u->outputs().size(); ++i) {
        if (u->def().shares_input(static_cast<int>(i)) != slot) continue;
        ir::Node* bc =
            mark(broadcast(u->output(static_cast<int>(i)), 0, group_,
                           u->input(static_cast<int>(slot))->producer()->name() + ".broadcast"),
                 -1)
                ->producer();
        put_after(g, bc, {after});
        after = bc;
      }
    }
    schedule_ += "updated parameters: broadcast from rank 0 after each update\n";
  }

  // OpenMPI advances a non-blocking collective only inside MPI calls: poll between the nodes
  // that run while reductions are in flight.
  if (overlap && options_.progress && strategy != ReduceStrategy::Root) {
    const int progress_group = strategy == ReduceStrategy::Hierarchical ? leaders_group : group_;
    const auto& order = g.nodes();
    auto first = std::find_if(order.begin(), order.end(),
                              [](const ir::Node* n) { return &n->def() == &op_allreduce_start; });
    auto last = std::find_if(order.rbegin(), order.rend(), [](const ir::Node* n) {
                  return is_wait(*n);
                }).base();
    // After each node that computes, past the collectives that directly follow it (a start
    // stays right after its gradient). Never inside a parallel section of thread replicas, which
    // a node without a replica would split.
    std::vector<ir::Node*> polled;
    for (auto it = first; it < last; ++it) {
      if (is_communication(**it) || (*it)->def().is_source() || (*it)->replica() >= 0) continue;
      auto end = it + 1;
      while (end < last && is_communication(**end) && !is_wait(**end)) ++end;
      if (end < last && is_wait(**end)) continue;  // waiting progresses too
      polled.push_back(*(end - 1));
    }
    for (ir::Node* n : polled) {
      ir::Node* p = mark(comm_progress(g, progress_group, "comm_progress"), -1);
      put_after(g, p, {n});
    }
    if (!polled.empty())
      schedule_ += fmt::format("comm_progress after {} nodes while reductions are in flight\n",
                               polled.size());
  }
  log_verbose("data-parallel", "schedule:\n{}", schedule_);
  return true;
}

}  // namespace minidl::parallel
