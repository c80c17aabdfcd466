#include "minidl/runtime/executable.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <unordered_map>

#include "minidl/core/clock.hpp"
#include "minidl/core/idle.hpp"
#include "minidl/core/log.hpp"

namespace minidl::runtime {
namespace {

std::size_t round_up(std::size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

/// Index of the first element of `bits` (n words) whose exponent bits are all ones (Inf or NaN),
/// or -1.
template <typename Word>
std::int64_t first_all_ones(const Word* bits, std::int64_t n, Word exponent) {
  constexpr std::int64_t kChunk = 4096;
  for (std::int64_t b = 0; b < n; b += kChunk) {
    const std::int64_t e = std::min(n, b + kChunk);
    bool any = false;
#pragma omp simd reduction(| : any)
    for (std::int64_t i = b; i < e; ++i) any |= (bits[i] & exponent) == exponent;
    if (!any) continue;
    for (std::int64_t i = b; i < e; ++i)
      if ((bits[i] & exponent) == exponent) return i;
  }
  return -1;
}

/// Index of the first NaN or Inf among t's elements (f32, or bf16: an f32's upper half), or -1.
std::int64_t first_nonfinite(const Tensor& t) {
  if (t.raw() == nullptr) return -1;
  if (t.dtype() == DType::F32)
    return first_all_ones(static_cast<const std::uint32_t*>(t.raw()), t.numel(),
                          std::uint32_t{0x7f800000u});
  if (t.dtype() == DType::BF16)
    return first_all_ones(static_cast<const std::uint16_t*>(t.raw()), t.numel(),
                          std::uint16_t{0x7f80u});
  return -1;
}

const char* nonfinite_name(const Tensor& t, std::int64_t i) {
  std::uint32_t bits = 0;
  if (t.dtype() == DType::BF16) {
    bits = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(t.raw())[i]) << 16;
  } else {
    bits = static_cast<const std::uint32_t*>(t.raw())[i];
  }
  if ((bits & 0x007fffffu) != 0) return "NaN";
  return (bits >> 31) == 0 ? "+Inf" : "-Inf";
}

/// Subnormal elements of t: exponent bits zero, fraction nonzero (f32, or bf16: an f32's upper
/// half); 0 for other types.
std::int64_t count_subnormals(const Tensor& t) {
  if (t.raw() == nullptr) return 0;
  const std::int64_t n = t.numel();
  std::int64_t count = 0;
  if (t.dtype() == DType::F32) {
    const auto* bits = static_cast<const std::uint32_t*>(t.raw());
#pragma omp simd reduction(+ : count)
    for (std::int64_t i = 0; i < n; ++i)
      count += (bits[i] & 0x7f800000u) == 0 && (bits[i] & 0x007fffffu) != 0;
  } else if (t.dtype() == DType::BF16) {
    const auto* bits = static_cast<const std::uint16_t*>(t.raw());
#pragma omp simd reduction(+ : count)
    for (std::int64_t i = 0; i < n; ++i)
      count += (bits[i] & 0x7f80u) == 0 && (bits[i] & 0x007fu) != 0;
  }
  return count;
}

/// Throws when one of step s's outputs holds a NaN or Inf (CompileOptions::check_numerics).
void check_numerics(const ir::Node& n, const std::vector<Tensor>& in,
                    const std::vector<Tensor>& out) {
  for (std::size_t o = 0; o < out.size(); ++o) {
    const std::int64_t i = first_nonfinite(out[o]);
    if (i < 0) continue;
    std::string inputs;
    for (std::size_t k = 0; k < in.size(); ++k) {
      const std::int64_t j = first_nonfinite(in[k]);
      const ir::Value* v = n.input(static_cast<int>(k));
      inputs +=
          fmt::format("{}{} ({}) {}", inputs.empty() ? "" : ", ", v->ref(), v->producer()->name(),
                      in[k].dtype() != DType::F32 && in[k].dtype() != DType::BF16 ? "(not f32)"
                      : j < 0                                                     ? "finite"
                              : fmt::format("has {} at element {}", nonfinite_name(in[k], j), j));
    }
    MINIDL_FAIL("check-numerics: ", n.describe(), " produced ", nonfinite_name(out[o], i),
                " at element ", i, " of output ", o, " ", out[o].shape(),
                "; its inputs: ", inputs.empty() ? "none" : inputs);
  }
}

}  // namespace

std::int64_t node_elements(const ir::Node& n) {
  std::int64_t e = 0;
  for (const ir::Value* v : n.inputs()) e += v->shape().numel();
  for (const ir::Value* v : n.outputs()) e += v->shape().numel();
  return e;
}

double trace_clock_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

Executable::Executable(const ir::Graph& g, CompileOptions options) : options_(options) {
  if (verbose("denormals")) options_.count_denormals = true;
  plan_memory(g);
  make_steps(g);
  if (options_.count_denormals) {
    for (const Step& s : steps_) {
      std::vector<SubnormalCount> outs;
      for (std::size_t o = 0; o < s.out.size(); ++o)
        outs.push_back({s.node->output(static_cast<int>(o)), s.out[o].numel()});
      subnormals_.push_back(std::move(outs));
    }
  }
}

Executable::~Executable() {
  if (options_.count_denormals && verbose("denormals")) {
    const std::string report = subnormal_report();
    log_line("denormals", report.substr(0, report.empty() ? 0 : report.size() - 1));
  }
}

std::vector<SubnormalCount> Executable::subnormals() const {
  std::vector<SubnormalCount> all;
  for (const auto& outs : subnormals_) all.insert(all.end(), outs.begin(), outs.end());
  return all;
}

std::string Executable::subnormal_report() const {
  if (!options_.count_denormals) return {};
  std::vector<SubnormalCount> all = subnormals();
  std::int64_t elements = 0, total = 0, last = 0;
  for (const SubnormalCount& c : all) {
    elements += c.elements;
    total += c.total;
    last += c.last;
  }
  std::erase_if(all, [](const SubnormalCount& c) { return c.total == 0; });
  std::stable_sort(all.begin(), all.end(), [](const SubnormalCount& a, const SubnormalCount& b) {
    return a.total > b.total;
  });
  std::size_t outputs = 0;
  for (const auto& outs : subnormals_) outputs += outs.size();
  std::string s = fmt::format(
      "subnormal numbers over {} runs: {} in total, {} in the last run, in {} of {} node outputs "
      "({} elements per run)\n",
      runs_, total, last, all.size(), outputs, elements);
  for (const SubnormalCount& c : all) {
    s += fmt::format(
        "  {} ({}) of {}: {} in total, at most {} in a run, {} in the last run, in {} runs ({} "
        "elements)\n",
        c.value->ref(), c.value->producer()->def().output_names()[c.value->index()],
        c.value->producer()->describe(), c.total, c.max, c.last, c.runs_with, c.elements);
  }
  return s;
}

void Executable::plan_memory(const ir::Graph& g) {
  std::unordered_map<const ir::Node*, int> pos;
  for (const ir::Node* n : g.nodes()) pos[n] = static_cast<int>(pos.size());
  // Within a parallel section the replicas run concurrently, so graph order says nothing about
  // which of their values are alive at once: a value defined in a section is taken as defined
  // at the section's first node and alive at least until its last one.
  std::unordered_map<const ir::Node*, std::pair<int, int>> section_of;  // node -> [first, last]
  {
    const auto& order = g.nodes();
    for (std::size_t i = 0; i < order.size();) {
      if (order[i]->replica() < 0 || order[i]->def().is_source()) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < order.size() && order[j]->replica() >= 0 && !order[j]->def().is_source()) ++j;
      for (std::size_t k = i; k < j; ++k)
        section_of[order[k]] = {static_cast<int>(i), static_cast<int>(j - 1)};
      i = j;
    }
  }
  auto used_until = [&](const ir::Node* n) {
    auto it = section_of.find(n);
    return it == section_of.end() ? pos.at(n) : it->second.second;
  };

  // Every value's storage root: in-place and alias outputs share their input's root.
  std::unordered_map<const ir::Value*, const ir::Value*> root;
  for (const ir::Node* n : g.nodes()) {
    for (std::size_t i = 0; i < n->outputs().size(); ++i) {
      const ir::Value* v = n->output(static_cast<int>(i));
      const int shared = n->def().shares_input(static_cast<int>(i));
      root[v] = shared >= 0 ? root.at(n->input(shared)) : v;
    }
  }
  constexpr int kForever = std::numeric_limits<int>::max();
  std::unordered_map<const ir::Value*, int> last_use;
  for (const ir::Node* n : g.nodes()) {
    for (const ir::Value* v : n->outputs()) {
      const ir::Value* r = root.at(v);
      last_use.try_emplace(r, used_until(n));
      for (const ir::Node* u : v->users()) last_use[r] = std::max(last_use[r], used_until(u));
    }
  }
  for (const ir::Value* v : g.outputs()) last_use[root.at(v)] = kForever;

  // Transient roots get buffers from a pool: best fit among free buffers, growing one if none
  // is large enough. A buffer returns to the pool after the last use of its root.
  std::vector<std::size_t> sizes;
  std::vector<int> free_list;
  std::unordered_map<const ir::Value*, int> buffer_of;
  std::unordered_map<const ir::Value*, std::size_t> persistent;  // root -> bytes, owned here
  std::vector<std::vector<const ir::Value*>> release_at(g.nodes().size());
  for (const ir::Node* n : g.nodes()) {
    for (const ir::Value* v : n->outputs()) {
      if (root.at(v) != v) continue;
      const std::size_t bytes = round_up(v->shape().numel() * dtype_size(v->stored()));
      if (n->def().is_source()) {
        if (n->op() == "input") persistent[v] = bytes;
        continue;
      }
      if (last_use.at(v) == kForever) {
        persistent[v] = bytes;
        continue;
      }
      plan_.naive_bytes += bytes;
      int best = -1;
      if (options_.reuse_memory) {
        for (int b : free_list) {
          const bool fits = sizes[b] >= bytes;
          if (best < 0) {
            best = b;
            continue;
          }
          const bool best_fits = sizes[best] >= bytes;
          if ((fits && (!best_fits || sizes[b] < sizes[best])) ||
              (!fits && !best_fits && sizes[b] > sizes[best]))
            best = b;
        }
      }
      if (best >= 0) {
        std::erase(free_list, best);
        sizes[best] = std::max(sizes[best], bytes);
      } else {
        best = static_cast<int>(sizes.size());
        sizes.push_back(bytes);
      }
      buffer_of[v] = best;
      release_at[last_use.at(v)].push_back(v);
    }
    for (const ir::Value* r : release_at[pos[n]]) free_list.push_back(buffer_of.at(r));
  }

  // Refused before anything is allocated, with what it would take.
  {
    std::size_t transient = 0, owned = 0;
    for (std::size_t b : sizes) transient += b;
    for (const auto& [v, b] : persistent) owned += b;
    check_fits_in_memory(transient + owned,
                         fmt::format("the graph ({} of intermediate values after buffer reuse, "
                                     "{} of inputs and outputs)",
                                     format_bytes(transient), format_bytes(owned)));
  }
  std::vector<void*> base(sizes.size());
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    buffers_.push_back(std::make_shared<Storage>(sizes[b]));
    base[b] = buffers_.back()->data();
    plan_.planned_bytes += sizes[b];
  }
  plan_.buffers = sizes.size();

  // A view for every value.
  std::unordered_map<const ir::Value*, Tensor> view;
  for (const ir::Node* n : g.nodes()) {
    for (const ir::Value* v : n->outputs()) {
      const ir::Value* r = root.at(v);
      void* data = nullptr;
      if (r != v) {
        data = view.at(r).raw();
      } else if (n->def().is_source() && n->op() != "input") {
        const Tensor& t = n->bound();
        MINIDL_CHECK(t.raw() != nullptr, n->describe(), ": no storage bound");
        MINIDL_CHECK(t.shape() == v->shape() && t.dtype() == v->dtype(), n->describe(),
                     ": bound storage is ", t.shape(), " ", t.dtype(), ", the graph expects ",
                     v->shape(), " ", v->dtype());
        data = t.raw();
      } else if (auto it = persistent.find(v); it != persistent.end()) {
        buffers_.push_back(std::make_shared<Storage>(it->second));
        data = buffers_.back()->data();
        plan_.persistent_bytes += it->second;
      } else {
        data = base[buffer_of.at(v)];
      }
      view[v] = Tensor::view(data, v->shape(), v->stored());
      tensors_.emplace_back(v, view[v]);
      if (n->op() == "input") inputs_.emplace_back(n->name(), view[v]);
      if (n->def().is_source() || last_use.at(r) == kForever) readable_.push_back(v);
    }
  }
  log_verbose("memory",
              "planned {} transient bytes in {} buffers ({} without reuse), {} persistent",
              plan_.planned_bytes, plan_.buffers, plan_.naive_bytes, plan_.persistent_bytes);
}

void Executable::make_steps(const ir::Graph& g) {
  std::unordered_map<const ir::Value*, Tensor> view(tensors_.begin(), tensors_.end());
  for (const ir::Node* n : g.nodes()) {
    if (n->def().is_source() || n->def().is_alias()) continue;
    // The kernel recorded when the passes ran (ir::choose_kernels), or chosen now for a graph
    // compiled without them: the same choice either way.
    const ir::KernelChoice choice = ir::kernel_for(*n, options_.backend);
    const ir::KernelDef* chosen = choice.kernel;
    MINIDL_CHECK(chosen != nullptr, n->describe(), ": no kernel accepts this node",
                 choice.declined);
    const std::string label = ir::kernel_label(*n, *chosen);
    log_verbose(
        "dispatch", "{} -> {}{}{}{}", n->describe(), label,
        ir::node_precision(*n) == ir::Precision::BF16 && !chosen->bf16
            ? " (in f32: this kernel has no bf16 path)"
            : "",
        n->replica() >= 0 ? fmt::format(" (replica {}: one thread)", n->replica()) : std::string(),
        choice.declined);
    // A node of a parallel section runs on one thread: its kernel is made for one thread too
    // (oneDNN plans a primitive's thread partition when it is created and would otherwise wait
    // for threads that the section does not have).
    ir::Kernel kernel;
    double injected = -1.0;
    if (options_.injected && n->def().comm_role() == ir::CommRole::None) {
      injected = std::max(0.0, options_.injected->seconds(*n));  // not made: never run
    } else if (n->replica() >= 0) {
      const int threads = omp_get_max_threads();
      omp_set_num_threads(1);
      try {
        kernel = chosen->make(*n);
      } catch (...) {
        omp_set_num_threads(threads);
        throw;
      }
      omp_set_num_threads(threads);
    } else {
      kernel = chosen->make(*n);
    }
    Step s{n, std::move(kernel), {}, {}, {}, label, injected};
    for (const ir::Value* v : n->inputs()) s.in.push_back(view.at(v));
    for (const ir::Value* v : n->outputs()) s.out.push_back(view.at(v));
    steps_.push_back(std::move(s));
  }
  // Spans into the steps' own vectors, taken once the steps no longer move.
  std::vector<std::int64_t> flops;  // per step, from the op's count (0: none)
  for (Step& s : steps_) {
    s.args = ir::KernelArgs{s.node, s.in, s.out};
    const ir::FlopsFn count = s.node->def().flops_fn();
    flops.push_back(count ? count(*s.node) : 0);
    flops_per_run_ += flops.back();
  }
  find_sections();
  if (options_.profile || options_.trace) {
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      const Step& s = steps_[i];
      profile_.push_back({s.node, s.kernel_name, 0, 0.0, flops[i], node_elements(*s.node)});
    }
  }
  if (options_.trace) {
    int threads = 1;
    for (const Section& sec : sections_) threads = std::max(threads, sec.replicas);
    trace_.resize(static_cast<std::size_t>(threads));
  }
}

void Executable::find_sections() {
  step_replica_.clear();
  for (const Step& s : steps_) step_replica_.push_back(s.node->replica());
  // Which replica produced each value of the current section, to reject cross-replica reads.
  std::unordered_map<const ir::Value*, int> producer_replica;
  for (std::size_t i = 0; i < steps_.size();) {
    if (step_replica_[i] < 0) {
      ++i;
      continue;
    }
    Section sec{i, i, 0, false};
    producer_replica.clear();
    for (; sec.end < steps_.size() && step_replica_[sec.end] >= 0; ++sec.end) {
      const ir::Node* n = steps_[sec.end].node;
      const int r = step_replica_[sec.end];
      for (const ir::Value* in : n->inputs()) {
        auto it = producer_replica.find(in);
        MINIDL_CHECK(it == producer_replica.end() || it->second == r, n->describe(), " (replica ",
                     r, ") reads ", in->ref(), " of replica ", it->second,
                     " in the same parallel section");
      }
      for (const ir::Value* out : n->outputs()) producer_replica[out] = r;
      sec.replicas = std::max(sec.replicas, r + 1);
      sec.serial = sec.serial || n->def().comm_role() != ir::CommRole::None;
    }
    sections_.push_back(sec);
    i = sec.end;
  }
}

void Executable::run_step(std::size_t i) {
  Step& s = steps_[i];
  if (s.injected >= 0.0) {
    options_.injected->spend(s.injected);
    return;
  }
  s.kernel(s.args);
}

void Executable::check_step(std::size_t i) {
  const Step& s = steps_[i];
  if (s.injected >= 0.0) return;  // no kernel ran
  if (options_.check_numerics) check_numerics(*s.node, s.in, s.out);
  if (options_.count_denormals) count_step_subnormals(i);
}

void Executable::run_steps(std::size_t begin, std::size_t end, int replica) {
  const bool timed = options_.profile || options_.trace;
  for (std::size_t i = begin; i < end; ++i) {
    if (replica >= 0 && step_replica_[i] != replica) continue;
    if (!timed) {
      run_step(i);
      check_step(i);
      continue;
    }
    // A kernel that waits for another process notes how long (core/idle.hpp): measured only
    // when asked, so that an untimed run does not pay for it.
    set_idle_wanted(true);
    take_idle();
    const double t0 = trace_clock_us();
    run_step(i);
    const double t1 = trace_clock_us();
    set_idle_wanted(false);
    // The wait happened at the start of the call, and within it.
    const double idle_us = std::clamp(take_idle() * 1e6, 0.0, t1 - t0);
    check_step(i);
    const double seconds = (t1 - t0) * 1e-6;
    if (profile_[i].calls == 0) profile_[i].first_seconds = seconds;
    profile_[i].calls++;
    profile_[i].seconds += seconds;
    profile_[i].idle_seconds += idle_us * 1e-6;
    if (options_.trace) {
      TraceBuffer& b = trace_[static_cast<std::size_t>(std::max(replica, 0))];
      const std::size_t events = idle_us > 0.0 ? 2 : 1;
      if (b.events.size() + events <= options_.trace_limit / trace_.size()) {
        const int thread = std::max(replica, 0);
        if (idle_us > 0.0) b.events.push_back({steps_[i].node, thread, t0, idle_us, true});
        b.events.push_back({steps_[i].node, thread, t0 + idle_us, t1 - t0 - idle_us});
      } else {
        b.dropped += events;
      }
    }
  }
}

void Executable::count_step_subnormals(std::size_t i) {
  for (std::size_t o = 0; o < steps_[i].out.size(); ++o) {
    SubnormalCount& c = subnormals_[i][o];
    const std::int64_t k = count_subnormals(steps_[i].out[o]);
    c.total += k;
    c.max = std::max(c.max, k);
    c.last = k;
    c.runs_with += k > 0;
  }
}

std::vector<TraceEvent> Executable::trace() const {
  std::vector<TraceEvent> all;
  for (const TraceBuffer& b : trace_) all.insert(all.end(), b.events.begin(), b.events.end());
  return all;
}

std::size_t Executable::dropped_events() const {
  std::size_t n = 0;
  for (const TraceBuffer& b : trace_) n += b.dropped;
  return n;
}

void Executable::run_section(const Section& sec) {
  // At most one thread per replica; with fewer threads than replicas, thread t runs a
  // contiguous block of them, one after the other. An exception in any is rethrown once all
  // have stopped.
  if (sec.serial) {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);  // the kernels were made for one thread
    try {
      for (int r = 0; r < sec.replicas; ++r) run_steps(sec.begin, sec.end, r);
    } catch (...) {
      omp_set_num_threads(threads);
      throw;
    }
    omp_set_num_threads(threads);
    return;
  }
  const int threads = std::min(sec.replicas, omp_get_max_threads());
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    // Kernels asking how many threads they may use get one (see make_steps).
    omp_set_num_threads(1);
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    try {
      for (int r = sec.replicas * t / nt; r < sec.replicas * (t + 1) / nt; ++r)
        run_steps(sec.begin, sec.end, r);
    } catch (...) {
#pragma omp critical(minidl_section_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void Executable::run() {
  std::size_t i = 0;
  for (const Section& sec : sections_) {
    run_steps(i, sec.begin, -1);
    run_section(sec);
    i = sec.end;
  }
  run_steps(i, steps_.size(), -1);
  ++runs_;
}

const Tensor& Executable::input(std::string_view name) const {
  for (const auto& [n, t] : inputs_)
    if (n == name) return t;
  std::string known;
  for (const auto& [n, t] : inputs_) known += (known.empty() ? "" : ", ") + n;
  MINIDL_FAIL("the graph has no input '", name, "' (inputs: ", known, ")");
}

const Tensor& Executable::value(const ir::Value* v) const {
  MINIDL_CHECK(std::count(readable_.begin(), readable_.end(), v) > 0, "value ", v->ref(), " of ",
               v->producer()->describe(),
               " is not readable after a run: add it as a graph output before compiling");
  for (const auto& [val, t] : tensors_)
    if (val == v) return t;
  MINIDL_FAIL("value ", v->ref(), " is not part of this executable");
}

std::string Executable::kernel_table() const {
  std::string s;
  for (const Step& st : steps_) s += fmt::format("{} -> {}\n", st.node->describe(), st.kernel_name);
  return s;
}

}  // namespace minidl::runtime
