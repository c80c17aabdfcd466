#include "minidl/train/pipeline.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>
#include <unordered_set>

#include "minidl/core/error.hpp"
#include "minidl/ir/order.hpp"
#include "minidl/parallel/collectives.hpp"
#include "minidl/parallel/data_parallel.hpp"
#include "minidl/train/pipeline_graph.hpp"

namespace minidl::train {

using Kind = PipelineAction::Kind;

std::string describe(const PipelineAction& a) {
  switch (a.kind) {
    case Kind::Forward:
      return fmt::format("F{}", a.micro);
    case Kind::Backward:
      return fmt::format("B{}", a.micro);
    case Kind::SendActivation:
      return fmt::format("send-act{}->{}", a.micro, a.peer);
    case Kind::RecvActivation:
      return fmt::format("recv-act{}<-{}", a.micro, a.peer);
    case Kind::SendGradient:
      return fmt::format("send-grad{}->{}", a.micro, a.peer);
    case Kind::RecvGradient:
      return fmt::format("recv-grad{}<-{}", a.micro, a.peer);
    case Kind::Update:
      break;
  }
  return "update";
}

std::vector<std::vector<PipelineAction>> make_schedule(const std::string& kind, int stages,
                                                       int micro) {
  MINIDL_CHECK(kind == "gpipe" || kind == "1f1b", "--schedule ", kind, " (expected gpipe or 1f1b)");
  MINIDL_CHECK(stages >= 1 && micro >= 1, "pipeline schedule: ", stages, " stage(s) and ", micro,
               " micro-batch(es)");
  std::vector<std::vector<PipelineAction>> all(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    auto& list = all[static_cast<std::size_t>(s)];
    auto forward = [&](int m) {
      if (s > 0) list.push_back({Kind::RecvActivation, m, s - 1});
      list.push_back({Kind::Forward, m, -1});
      if (s + 1 < stages) list.push_back({Kind::SendActivation, m, s + 1});
    };
    auto backward = [&](int m) {
      if (s + 1 < stages) list.push_back({Kind::RecvGradient, m, s + 1});
      list.push_back({Kind::Backward, m, -1});
      if (s > 0) list.push_back({Kind::SendGradient, m, s - 1});
    };
    if (kind == "gpipe") {
      for (int m = 0; m < micro; ++m) forward(m);
      for (int m = micro - 1; m >= 0; --m) backward(m);
    } else {
      // 1F1B: P - 1 - s forwards, then a forward and a backward in turn, then the backwards.
      const int warm = std::min(stages - 1 - s, micro);
      for (int m = 0; m < warm; ++m) forward(m);
      for (int i = 0; i + warm < micro; ++i) {
        // Blocking sends: the next stage sends micro-batch i's gradient before it receives the
        // new activation, so the gradient is received before the activation is sent.
        const int m = i + warm;
        if (s > 0) list.push_back({Kind::RecvActivation, m, s - 1});
        list.push_back({Kind::Forward, m, -1});
        if (s + 1 < stages) list.push_back({Kind::RecvGradient, i, s + 1});
        if (s + 1 < stages) list.push_back({Kind::SendActivation, m, s + 1});
        list.push_back({Kind::Backward, i, -1});
        if (s > 0) list.push_back({Kind::SendGradient, i, s - 1});
      }
      for (int m = micro - warm; m < micro; ++m) backward(m);
    }
    list.push_back({Kind::Update, -1, -1});
  }
  return all;
}

namespace {

bool is_send(Kind k) { return k == Kind::SendActivation || k == Kind::SendGradient; }
bool is_recv(Kind k) { return k == Kind::RecvActivation || k == Kind::RecvGradient; }
Kind matching(Kind k) {
  switch (k) {
    case Kind::SendActivation:
      return Kind::RecvActivation;
    case Kind::RecvActivation:
      return Kind::SendActivation;
    case Kind::SendGradient:
      return Kind::RecvGradient;
    case Kind::RecvGradient:
      return Kind::SendGradient;
    default:
      return k;
  }
}

}  // namespace

std::vector<int> check_schedule(const std::vector<std::vector<PipelineAction>>& schedule,
                                int micro) {
  const int stages = static_cast<int>(schedule.size());
  std::vector<int> slots(schedule.size(), 0);
  // Each list alone: every action once, in an order its data allow.
  for (int s = 0; s < stages; ++s) {
    const auto& list = schedule[static_cast<std::size_t>(s)];
    std::map<std::pair<Kind, int>, std::size_t> at;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const PipelineAction& a = list[i];
      MINIDL_CHECK(a.kind == Kind::Update || (a.micro >= 0 && a.micro < micro),
                   "pipeline schedule: stage ", s, ", action ", i, " '", describe(a),
                   "': micro-batch outside [0, ", micro, ")");
      if (is_send(a.kind) || is_recv(a.kind)) {
        const int want =
            (a.kind == Kind::SendActivation || a.kind == Kind::RecvGradient) ? s + 1 : s - 1;
        MINIDL_CHECK(a.peer == want && want >= 0 && want < stages, "pipeline schedule: stage ", s,
                     ", action ", i, " '", describe(a), "': the partner must be stage ", want);
      }
      MINIDL_CHECK(at.emplace(std::make_pair(a.kind, a.micro), i).second,
                   "pipeline schedule: stage ", s, ", action ", i, " '", describe(a),
                   "' appears twice");
    }
    auto need = [&](Kind k, int m, bool present, std::size_t before, const PipelineAction& a) {
      const auto it = at.find({k, m});
      MINIDL_CHECK(!present || it != at.end(), "pipeline schedule: stage ", s, " lacks '",
                   describe(PipelineAction{k, m, a.peer}), "' for micro-batch ", m);
      MINIDL_CHECK(present || it == at.end(), "pipeline schedule: stage ", s, " has '",
                   describe(it->second < list.size() ? list[it->second] : a),
                   "', but it has no partner stage");
      if (present)
        MINIDL_CHECK(it->second < before, "pipeline schedule: stage ", s, ", action ", before, " '",
                     describe(list[before]), "' comes before '", describe(list[it->second]),
                     "' (action ", it->second, ") that it needs");
    };
    for (int m = 0; m < micro; ++m) {
      const auto f = at.find({Kind::Forward, m}), b = at.find({Kind::Backward, m});
      MINIDL_CHECK(f != at.end(), "pipeline schedule: stage ", s, " has no forward of micro-batch ",
                   m);
      MINIDL_CHECK(b != at.end(), "pipeline schedule: stage ", s,
                   " has no backward of micro-batch ", m);
      need(Kind::Forward, m, true, b->second, list[b->second]);
      need(Kind::RecvActivation, m, s > 0, f->second, list[f->second]);
      need(Kind::RecvGradient, m, s + 1 < stages, b->second, list[b->second]);
      if (s + 1 < stages) {
        const auto send = at.find({Kind::SendActivation, m});
        MINIDL_CHECK(send != at.end(), "pipeline schedule: stage ", s, " never sends micro-batch ",
                     m, "'s activation to stage ", s + 1);
        need(Kind::Forward, m, true, send->second, list[send->second]);
      }
      if (s > 0) {
        const auto send = at.find({Kind::SendGradient, m});
        MINIDL_CHECK(send != at.end(), "pipeline schedule: stage ", s, " never sends micro-batch ",
                     m, "'s gradient to stage ", s - 1);
        need(Kind::Backward, m, true, send->second, list[send->second]);
      }
    }
    const auto u = at.find({Kind::Update, -1});
    MINIDL_CHECK(u != at.end() && u->second + 1 == list.size(), "pipeline schedule: stage ", s,
                 " must end with its update");
    int live = 0;
    for (const PipelineAction& a : list) {
      if (a.kind == Kind::Forward)
        slots[static_cast<std::size_t>(s)] = std::max(slots[static_cast<std::size_t>(s)], ++live);
      if (a.kind == Kind::Backward) --live;
    }
  }
  // All lists together, a send waiting for its receive (MPI_Send of a large message): a step
  // that nobody can take is a deadlock or a mismatch.
  std::vector<std::size_t> next(schedule.size(), 0);
  for (;;) {
    bool moved = false, done = true;
    for (int s = 0; s < stages; ++s) {
      auto& i = next[static_cast<std::size_t>(s)];
      const auto& list = schedule[static_cast<std::size_t>(s)];
      while (i < list.size()) {
        const PipelineAction& a = list[i];
        if (!is_send(a.kind) && !is_recv(a.kind)) {
          ++i;
          moved = true;
          continue;
        }
        auto& j = next[static_cast<std::size_t>(a.peer)];
        const auto& other = schedule[static_cast<std::size_t>(a.peer)];
        if (j < other.size() && other[j].kind == matching(a.kind) && other[j].peer == s &&
            other[j].micro == a.micro) {
          ++i;
          ++j;
          moved = true;
          continue;
        }
        break;
      }
      done = done && i == list.size();
    }
    if (done) return slots;
    if (moved) continue;
    // Nobody can move: report the first stage that waits, and what its partner waits at.
    for (int s = 0; s < stages; ++s) {
      const auto& list = schedule[static_cast<std::size_t>(s)];
      const std::size_t i = next[static_cast<std::size_t>(s)];
      if (i == list.size()) continue;
      const PipelineAction& a = list[i];
      const auto& other = schedule[static_cast<std::size_t>(a.peer)];
      const std::size_t j = next[static_cast<std::size_t>(a.peer)];
      MINIDL_FAIL("pipeline schedule: stage ", s, " (rank ", s, ") would wait forever at action ",
                  i, " '", describe(a), "': its partner, stage ", a.peer, ", is at ",
                  j < other.size() ? fmt::format("action {} '{}'", j, describe(other[j]))
                                   : std::string("the end of its list"),
                  " (a deadlock, or the stages disagree on the micro-batches' order)");
    }
  }
}

std::string format_schedule(const std::vector<std::vector<PipelineAction>>& schedule) {
  std::string out;
  for (std::size_t s = 0; s < schedule.size(); ++s) {
    out += fmt::format("stage {} (rank {}):", s, s);
    for (const PipelineAction& a : schedule[s]) out += " " + describe(a);
    out += "\n";
  }
  return out;
}

// ---- the graph ---------------------------------------------------------------------------------

namespace {

constexpr int kTagBase = 1 << 12;
// A tag per micro-batch, edge (value crossing the boundary) and direction; the boundary is
// told apart by the peer.
int pipeline_tag(int micro, std::size_t edge, bool gradient) {
  return kTagBase + ((micro * 16 + static_cast<int>(edge)) * 2 + (gradient ? 1 : 0));
}

// Ops a cut must not separate from the product before them: the fusion passes fold them into it,
// and a cut would change what the kernels compute.
bool fuses_into_producer(const ir::Node& n) { return n.op() == "bias_add" || n.op() == "relu"; }

// A node that updates a state source in place (BatchNorm's running statistics): the first
// micro-batch's forward holds it alone, so it is not one of the positions the micro-batches
// share; it goes with its other inputs' stage.
bool updates_state(const ir::Node& n) {
  if (n.def().is_alias()) return false;
  for (std::size_t o = 0; o < n.outputs().size(); ++o) {
    const int in = n.def().shares_input(static_cast<int>(o));
    if (in >= 0 && n.input(static_cast<std::size_t>(in))->producer()->op() == "state") return true;
  }
  return false;
}

std::int64_t param_elements(const ir::Node& n) {
  std::int64_t e = 0;
  for (const ir::Value* in : n.inputs())
    if (in->producer()->op() == "parameter") e += in->shape().numel();
  return e;
}

}  // namespace

std::unordered_map<const ir::Node*, int> assign_stages(
    const ir::Graph& g, const std::vector<ForwardRange>& forwards, int stages,
    const std::vector<std::string>& boundaries, std::string* summary,
    const std::map<std::string, double>* node_seconds, const std::string& balance) {
  MINIDL_CHECK(balance == "time" || balance == "flops" || balance == "params", "--stage-balance ",
               balance, " (expected time, flops or params)");
  MINIDL_CHECK(!forwards.empty(), "pipeline: no forward to cut");
  const std::vector<ir::Node*>& nodes = g.nodes();
  auto computed = [&](const ForwardRange& f) {
    std::vector<const ir::Node*> list;
    for (std::size_t i = f.begin; i < f.end; ++i)
      if (!nodes[i]->def().is_source() && !updates_state(*nodes[i])) list.push_back(nodes[i]);
    return list;
  };
  const std::vector<const ir::Node*> first = computed(forwards[0]);
  const std::size_t n = first.size();
  std::unordered_map<const ir::Node*, std::size_t> pos;
  for (std::size_t i = 0; i < n; ++i) pos[first[i]] = i;
  // The state updates of the first forward, at the position of their last computed input.
  std::unordered_map<const ir::Node*, std::size_t> update_pos;
  for (std::size_t i = forwards[0].begin; i < forwards[0].end; ++i) {
    if (nodes[i]->def().is_source() || !updates_state(*nodes[i])) continue;
    std::size_t at = 0;
    for (const ir::Value* in : nodes[i]->inputs()) {
      const auto it = pos.find(in->producer());
      if (it != pos.end()) at = std::max(at, it->second);
    }
    update_pos[nodes[i]] = at;
  }
  // Places to cut: after position i, when exactly one computed value crosses, and its readers
  // after the cut are not folded into its producer.
  std::vector<int> crossing(n, 0);
  std::vector<bool> clean(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    for (const ir::Value* v : first[i]->outputs()) {
      std::size_t last = i;
      bool out = v == forwards[0].output;
      for (const ir::Node* u : v->users()) {
        if (const auto up = update_pos.find(u); up != update_pos.end()) {
          last = std::max(last, up->second);
          continue;
        }
        const auto it = pos.find(u);
        if (it == pos.end()) {
          out = true;
          continue;
        }
        last = std::max(last, it->second);
        if (fuses_into_producer(*u))
          for (std::size_t k = i; k < it->second; ++k) clean[k] = false;
      }
      if (out) last = n;
      for (std::size_t k = i; k < last && k < n; ++k) ++crossing[k];
    }
  }
  std::vector<std::size_t> candidates;
  for (std::size_t i = 0; i + 1 < n; ++i)
    if (crossing[i] == 1 && clean[i]) candidates.push_back(i);
  std::vector<std::int64_t> cum(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) cum[i + 1] = cum[i] + param_elements(*first[i]);
  const std::int64_t total = cum[n];
  // The stages are balanced by the forward's FLOPs (the ops' own counts: the same on every rank,
  // and proportional to the backward's), or by parameter count when no op has a count.
  std::vector<std::int64_t> flops(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const ir::FlopsFn f = first[i]->def().flops_fn();
    flops[i + 1] = flops[i] + (f != nullptr ? f(*first[i]) : 0);
  }
  // Profiled time, in nanoseconds (integers, as the other measures: the search compares them
  // exactly, and every rank has the same table).
  // A parameter's update (the table has it under the parameter's name) goes with the first
  // node that reads it: the stage that holds it runs it.
  std::vector<std::int64_t> nanos(n + 1, 0);
  std::unordered_set<const ir::Node*> counted;
  auto seconds = [&](const std::string& name) {
    const auto it = node_seconds->find(name);
    return it != node_seconds->end() ? std::llround(it->second * 1e9) : 0LL;
  };
  for (std::size_t i = 0; i < n && node_seconds != nullptr; ++i) {
    nanos[i + 1] = nanos[i] + seconds(first[i]->name());
    for (const ir::Value* in : first[i]->inputs())
      if (in->producer()->op() == "parameter" && counted.insert(in->producer()).second)
        nanos[i + 1] += seconds(in->producer()->name());
  }
  const bool by_time = balance == "time" && nanos[n] > 0;
  const bool by_flops = !by_time && balance != "params" && flops[n] > 0;
  const std::vector<std::int64_t>& wcum = by_time ? nanos : by_flops ? flops : cum;
  std::vector<std::size_t> cuts;
  if (!boundaries.empty()) {
    MINIDL_CHECK(static_cast<int>(boundaries.size()) == stages - 1, "pipeline: ", boundaries.size(),
                 " stage boundaries for ", stages, " stages (expected ", stages - 1, ")");
    for (const std::string& b : boundaries) {
      // A node's name, or a module's: the last node in its scope ("act1" ends at "act1.relu").
      auto it = std::find_if(first.begin(), first.end(),
                             [&](const ir::Node* x) { return x->name() == b; });
      if (it == first.end()) {
        const auto r = std::find_if(first.rbegin(), first.rend(), [&](const ir::Node* x) {
          return x->name().rfind(b + ".", 0) == 0;
        });
        if (r != first.rend()) it = std::prev(r.base());
      }
      MINIDL_CHECK(it != first.end(), "pipeline: the stage boundary '", b,
                   "' names no node or module of the model's forward");
      const auto i = static_cast<std::size_t>(it - first.begin());
      MINIDL_CHECK(std::count(candidates.begin(), candidates.end(), i) == 1,
                   "pipeline: the forward cannot be cut after '", b, "': ",
                   crossing[i] != 1 ? fmt::format("{} values cross there (one must)", crossing[i])
                                    : std::string("the next op is fused into it"));
      MINIDL_CHECK(cuts.empty() || i > cuts.back(),
                   "pipeline: the stage boundaries are not in "
                   "the forward's order ('",
                   b, "')");
      cuts.push_back(i);
    }
  } else {
    MINIDL_CHECK(static_cast<int>(candidates.size()) >= stages - 1, "pipeline: ", stages,
                 " stages need ", stages - 1,
                 " place(s) where the forward can be cut (one value "
                 "crossing), the model has ",
                 candidates.size());
    // The cuts whose heaviest stage is lightest, then with the smallest sum of squared stage
    // weights (the most even): a search over the places to cut, P - 1 of them.
    using Cost = std::pair<std::int64_t, double>;
    const std::size_t c = candidates.size();
    auto weight = [&](std::size_t from_pos, std::size_t to_pos) {  // positions [from, to)
      return wcum[to_pos] - wcum[from_pos];
    };
    auto add = [](Cost a, std::int64_t w) {
      return Cost{std::max(a.first, w), a.second + static_cast<double>(w) * static_cast<double>(w)};
    };
    // best[k][j]: the first k + 1 stages, the k-th cut at candidates[j].
    std::vector<std::vector<Cost>> best(static_cast<std::size_t>(stages - 1),
                                        std::vector<Cost>(c, {LLONG_MAX, 0.0}));
    std::vector<std::vector<std::size_t>> prev(best.size(), std::vector<std::size_t>(c, 0));
    for (std::size_t j = 0; j < c; ++j) best[0][j] = add({0, 0.0}, weight(0, candidates[j] + 1));
    for (std::size_t k = 1; k < best.size(); ++k) {
      for (std::size_t j = k; j < c; ++j) {
        for (std::size_t i = k - 1; i < j; ++i) {
          if (best[k - 1][i].first == LLONG_MAX) continue;
          const Cost t = add(best[k - 1][i], weight(candidates[i] + 1, candidates[j] + 1));
          if (t < best[k][j]) {
            best[k][j] = t;
            prev[k][j] = i;
          }
        }
      }
    }
    std::size_t end = 0;
    Cost top{LLONG_MAX, 0.0};
    for (std::size_t j = best.size() - 1; j < c; ++j) {
      if (best.back()[j].first == LLONG_MAX) continue;
      const Cost t = add(best.back()[j], weight(candidates[j] + 1, n));
      if (t < top) {
        top = t;
        end = j;
      }
    }
    cuts.resize(best.size());
    for (std::size_t k = best.size(); k-- > 0;) {
      cuts[k] = candidates[end];
      end = prev[k][end];
    }
  }
  std::unordered_map<const ir::Node*, int> stage_of;
  for (const ForwardRange& f : forwards) {
    const std::vector<const ir::Node*> list = computed(f);
    MINIDL_CHECK(list.size() == n, "pipeline: the micro-batches' forwards differ (", n, " and ",
                 list.size(), " nodes)");
    for (std::size_t i = 0; i < n; ++i) {
      // Position i belongs to the stage of the cuts before it: cut c ends stage c at its node.
      int s = 0;
      while (s < static_cast<int>(cuts.size()) && i > cuts[static_cast<std::size_t>(s)]) ++s;
      stage_of[list[i]] = s;
    }
  }
  for (const auto& [x, at] : update_pos) stage_of[x] = stage_of.at(first[at]);
  // The rest (the targets, the loss) in the last stage; sources with their readers.
  for (const ir::Node* x : nodes) {
    if (x->def().is_source() || stage_of.count(x)) continue;
    stage_of[x] = stages - 1;
  }
  for (const ir::Node* x : nodes) {
    if (!x->def().is_source()) continue;
    int s = -1;
    for (const ir::Value* v : x->outputs()) {
      for (const ir::Node* u : v->users()) {
        const int su = stage_of.at(u);
        MINIDL_CHECK(s < 0 || s == su || x->op() == "input", "pipeline: ", x->describe(),
                     " is read in stages ", s, " and ", su, ": a parameter must be in one stage");
        s = s < 0 ? su : std::min(s, su);
      }
    }
    stage_of[x] = s < 0 ? 0 : s;
  }
  if (summary != nullptr) {
    std::string text = fmt::format("pipeline: {} stages, cut after", stages);
    for (std::size_t c = 0; c < cuts.size(); ++c)
      text += fmt::format("{} '{}'", c ? "," : "", first[cuts[c]]->name());
    // Each stage's part of a cumulative measure (cum, nanos, flops: [i] = the first i nodes').
    auto shares = [&](const char* what, const std::vector<std::int64_t>& sum, auto format) {
      text += what;
      std::int64_t prev = 0;
      for (int s = 0; s < stages; ++s) {
        const std::int64_t end =
            s + 1 < stages ? sum[cuts[static_cast<std::size_t>(s)] + 1] : sum[n];
        text += format(end - prev,
                       100.0 * static_cast<double>(end - prev) / static_cast<double>(sum[n]));
        prev = end;
      }
    };
    if (total > 0)
      shares("; parameters per stage:", cum,
             [](std::int64_t v, double pct) { return fmt::format(" {} ({:.1f}%)", v, pct); });
    if (by_time)
      shares("; profiled time per stage (forward and backward):", nanos,
             [](std::int64_t v, double pct) {
               return fmt::format(" {:.3f} ms ({:.1f}%)", static_cast<double>(v) * 1e-6, pct);
             });
    if (by_flops || (by_time && flops[n] > 0))
      shares("; forward FLOPs per stage:", flops,
             [](std::int64_t v, double pct) { return fmt::format(" {} ({:.1f}%)", v, pct); });
    text += !boundaries.empty() ? std::string("; cut where told")
            : by_time           ? std::string("; balanced by profiled time")
            : by_flops          ? std::string("; balanced by forward FLOPs")
            : balance == "params"
                ? std::string("; balanced by parameter count")
                : std::string("; balanced by parameter count (no op counts FLOPs)");
    if (boundaries.empty() && balance == "time" && !by_time && node_seconds != nullptr)
      text += " (no profiled time)";
    *summary = text;
  }
  return stage_of;
}

StageCut cut_stage(ir::Graph& g, const std::unordered_map<const ir::Node*, int>& stage_of,
                   int stage, int group, int prev_rank, int next_rank) {
  StageCut cut;
  int micro = 0;
  for (const ir::Node* n : g.nodes()) micro = std::max(micro, n->replica() + 1);
  cut.received.resize(static_cast<std::size_t>(micro));
  cut.sent.resize(static_cast<std::size_t>(micro));
  // The crossing values, found before the graph changes.
  struct Edge {
    ir::Value* v;
    int from, to, micro;
  };
  std::vector<Edge> edges;
  for (ir::Node* n : g.nodes()) {
    const int a = stage_of.at(n);
    for (ir::Value* v : n->outputs()) {
      int to = -1;
      for (const ir::Node* u : v->users()) {
        const int b = stage_of.at(u);
        if (b == a || n->def().is_source()) continue;
        MINIDL_CHECK(b == a + 1 && (to < 0 || to == b), "pipeline: ", n->describe(),
                     " is read in stage ", b, " but computed in stage ", a,
                     ": only the next stage may read a stage's values");
        to = b;
      }
      if (to < 0) continue;
      MINIDL_CHECK(n->replica() >= 0, "pipeline: ", n->describe(),
                   " crosses stages but belongs to no micro-batch");
      edges.push_back({v, a, to, n->replica()});
    }
  }
  for (const Edge& e : edges) {
    const auto m = static_cast<std::size_t>(e.micro);
    if (e.from == stage) {
      const std::size_t edge = cut.sent[m].size();
      ir::Node* s = parallel::send(e.v, next_rank, pipeline_tag(e.micro, edge, false), group,
                                   fmt::format("pipeline.send_act{}.{}", e.micro, edge));
      s->set_replica(e.micro);
      s->set_phase(ir::Phase::Communication);
      s->annotations().set("pipeline", std::string("send-act"));
      parallel::set_stage(*s, stage);
      cut.sent[m].push_back(e.v);
    } else if (e.to == stage) {
      const std::size_t edge = cut.received[m].size();
      ir::Value* r = parallel::recv(g, e.v->shape(), e.v->dtype(), prev_rank,
                                    pipeline_tag(e.micro, edge, false), group,
                                    fmt::format("pipeline.recv_act{}.{}", e.micro, edge));
      r->producer()->set_replica(e.micro);
      r->producer()->set_phase(ir::Phase::Communication);
      r->producer()->annotations().set("pipeline", std::string("recv-act"));
      parallel::set_stage(*r->producer(), stage);
      g.move_before(r->producer(), e.v->producer());  // before every reader
      g.replace_uses(e.v, r);
      cut.received[m].push_back(r);
    }
  }
  for (ir::Node* n : g.nodes())
    if (stage_of.count(n)) parallel::set_stage(*n, stage_of.at(n));
  // The other stages' side effects (their state updates) go, so that dead-code elimination
  // drops everything else of theirs.
  std::vector<ir::Node*> theirs;
  for (ir::Node* n : g.nodes())
    if (!n->def().is_source() && n->def().has_side_effect() && stage_of.count(n) &&
        stage_of.at(n) != stage)
      theirs.push_back(n);
  g.remove(theirs);
  return cut;
}

std::vector<std::pair<ir::Value*, ir::Value*>> receive_gradients(ir::Graph& g, const StageCut& cut,
                                                                 int stage, int next_rank,
                                                                 int group) {
  std::vector<std::pair<ir::Value*, ir::Value*>> seeds;
  for (std::size_t m = 0; m < cut.sent.size(); ++m) {
    for (std::size_t e = 0; e < cut.sent[m].size(); ++e) {
      ir::Value* v = cut.sent[m][e];
      ir::Value* r = parallel::recv(g, v->shape(), v->dtype(), next_rank,
                                    pipeline_tag(static_cast<int>(m), e, true), group,
                                    fmt::format("pipeline.recv_grad{}.{}", m, e));
      r->producer()->set_replica(static_cast<int>(m));
      r->producer()->set_phase(ir::Phase::Communication);
      r->producer()->annotations().set("pipeline", std::string("recv-grad"));
      parallel::set_stage(*r->producer(), stage);
      seeds.emplace_back(v, r);
    }
  }
  return seeds;
}

void send_gradients(ir::Graph& g, const StageCut& cut, const std::vector<ir::Value*>& grads,
                    int stage, int prev_rank, int group) {
  (void)g;
  std::size_t k = 0;
  for (std::size_t m = 0; m < cut.received.size(); ++m) {
    for (std::size_t e = 0; e < cut.received[m].size(); ++e) {
      ir::Node* s =
          parallel::send(grads.at(k++), prev_rank, pipeline_tag(static_cast<int>(m), e, true),
                         group, fmt::format("pipeline.send_grad{}.{}", m, e));
      s->set_replica(static_cast<int>(m));
      s->set_phase(ir::Phase::Communication);
      s->annotations().set("pipeline", std::string("send-grad"));
      parallel::set_stage(*s, stage);
    }
  }
}

void order_by_schedule(ir::Graph& g, const std::vector<PipelineAction>& actions) {
  std::map<std::pair<Kind, int>, std::int64_t> rank_of;
  for (std::size_t i = 0; i < actions.size(); ++i)
    rank_of[{actions[i].kind, actions[i].micro}] = static_cast<std::int64_t>(i);
  // Nodes of no micro-batch: shared work (reading no micro-batch's values) runs first, what
  // joins several micro-batches (the gradients' sums, the loss's total) as soon as its inputs
  // exist (so a micro-batch's weight gradients are summed, and freed, early), the updates last.
  std::unordered_set<const ir::Node*> joins;
  for (const ir::Node* n : g.nodes()) {
    if (n->replica() >= 0 || n->annotations().has("pipeline")) continue;
    bool any = n->phase() == ir::Phase::Update;
    for (const ir::Value* in : n->inputs())
      any = any || in->producer()->replica() >= 0 ||
            in->producer()->annotations().has("pipeline") || joins.count(in->producer()) > 0;
    if (any) joins.insert(n);
  }
  // The action a node belongs to is its key in the order (a join: its latest input's).
  std::unordered_map<const ir::Node*, std::int64_t> keys;
  auto key = [&](const ir::Node* n) -> std::int64_t {
    const auto known = keys.find(n);
    if (known != keys.end()) return known->second;
    const int m = n->replica();
    const bool comm = n->annotations().has("pipeline");
    if (!comm && m < 0 && n->phase() == ir::Phase::Update) return LLONG_MAX;
    if (!comm && m < 0 && joins.count(n)) {
      std::int64_t latest = -1;
      for (const ir::Value* in : n->inputs()) latest = std::max(latest, keys.at(in->producer()));
      return latest;
    }
    if (!comm && m < 0) return -1;
    if (!comm && n->def().is_source()) return -1;
    Kind k = n->phase() == ir::Phase::Backward ? Kind::Backward : Kind::Forward;
    if (comm) {
      const std::string& what = std::get<std::string>(*n->annotations().find("pipeline"));
      k = what == "send-act"    ? Kind::SendActivation
          : what == "recv-act"  ? Kind::RecvActivation
          : what == "send-grad" ? Kind::SendGradient
                                : Kind::RecvGradient;
    }
    const auto it = rank_of.find({k, m});
    MINIDL_CHECK(it != rank_of.end(), "pipeline: ", n->describe(), " belongs to '",
                 describe(PipelineAction{k, m, -1}), "', which the stage's schedule lacks");
    return it->second;
  };
  for (const ir::Node* n : g.nodes()) keys[n] = key(n);  // graph order: inputs first
  const std::vector<ir::Node*>& nodes = g.nodes();
  std::unordered_map<const ir::Node*, std::size_t> index;
  for (std::size_t i = 0; i < nodes.size(); ++i) index[nodes[i]] = i;
  // The sends and receives in exactly the schedule's order, whatever else is ready.
  std::vector<std::pair<std::int64_t, std::size_t>> comms;
  for (const ir::Node* n : nodes)
    if (n->annotations().has("pipeline")) comms.emplace_back(key(n), index.at(n));
  std::sort(comms.begin(), comms.end());
  std::vector<std::pair<const ir::Node*, const ir::Node*>> extra;
  for (std::size_t i = 1; i < comms.size(); ++i)
    extra.emplace_back(nodes[comms[i - 1].second], nodes[comms[i].second]);
  g.reorder(ir::ordered_by(g, key, extra, "pipeline"));
  // Sends and receives run on the main thread (MPI_THREAD_FUNNELED), between the sections.
  for (ir::Node* n : g.nodes())
    if (n->annotations().has("pipeline")) n->set_replica(-1);
}

}  // namespace minidl::train
