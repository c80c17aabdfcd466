// The runtime: compile a graph once (take each node's kernel, as recorded by the passes or chosen
// now; plan buffers with liveness-based reuse; allocate), then run it every step as a flat list
// of kernel calls with no allocation.
//
// Parallel sections: a run of consecutive nodes that carry a replica (ir::Node::replica) is one
// section. Within it the nodes of replica r run in graph order on one OpenMP thread, the
// replicas at once (with fewer threads than replicas, each thread runs a contiguous block of
// them in turn; kernels called inside the section run serially on their thread); the sections are
// how data-parallel thread replicas execute (parallel::ThreadReplicas builds them). A node of a
// section must not read a value another replica of the same section produces (checked at
// compile time), and no buffer is shared between values of a section.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "minidl/ir/graph.hpp"

namespace minidl::runtime {

/// Compute time injected instead of computed: where only the time of a run matters (a simulated
/// cluster whose per-node compute time comes from a profile of a real run), the kernels do not
/// run; each call spends the time the table gives for its node. Nodes that communicate
/// (ir::CommRole other than None) still run.
struct InjectedCompute {
  /// Seconds one call of n's kernel takes (0 for a node the table does not know).
  std::function<double(const ir::Node& n)> seconds;
  /// Passes that much time (a simulated build: the simulator's clock advances).
  std::function<void(double seconds)> spend;
};

/// The elements a call of n's kernel reads and writes: the sum of its inputs' and outputs'
/// element counts. Affine in the batch for every node, so a time measured at a few batch sizes
/// can be interpolated in it (the key of a compute table, see InjectedCompute).
std::int64_t node_elements(const ir::Node& n);

struct CompileOptions {
  /// Preferred backend; others are the fallback when it declines a node. A node annotation
  /// "backend" (native|onednn) overrides this for that node.
  ir::Backend backend = ir::Backend::Native;
  /// The arithmetic of kernels that have a bf16 path. Like backend, it is read by the passes
  /// that prepare a graph (ops::MixedPrecision marks the nodes); the runtime runs what they
  /// marked.
  ir::Precision precision = ir::Precision::F32;
  /// Reuse buffers of values that are dead (off: every value gets its own buffer).
  bool reuse_memory = true;
  /// Measure each kernel's time (see Executable::profile()).
  bool profile = false;
  /// Record every kernel call as a timeline event (see Executable::trace()), at most
  /// trace_limit events; later calls are counted but not recorded.
  bool trace = false;
  std::size_t trace_limit = 4'000'000;
  /// After every kernel, scan the node's f32 outputs for NaN and Inf; the first node that
  /// produced one throws minidl::Error naming it, its op, the element, and which of its inputs
  /// were already non-finite. Costs a pass over every output.
  bool check_numerics = false;
  /// After every kernel, count the subnormal numbers (|x| < 2^-126, nonzero; f32 and bf16) in
  /// the node's outputs: activations, gradients, updated parameters and optimizer state.
  /// Executable::subnormal_report() tabulates them; MINIDL_VERBOSE=denormals turns this on and
  /// prints the table when the executable is destroyed. Costs a pass over every output.
  bool count_denormals = false;
  /// Set: kernels are not made nor run, their time is spent instead (see InjectedCompute).
  std::shared_ptr<const InjectedCompute> injected;
};

/// Subnormal numbers in one output of one node, over the runs of an executable.
struct SubnormalCount {
  const ir::Value* value;
  std::int64_t elements = 0;   // the value's size
  std::int64_t total = 0;      // summed over all runs
  std::int64_t max = 0;        // in the run that had the most
  std::int64_t last = 0;       // in the latest run
  std::int64_t runs_with = 0;  // runs in which it held at least one
};

struct MemoryPlan {
  std::size_t planned_bytes = 0;  // transient buffers after reuse
  std::size_t naive_bytes = 0;    // the same values without reuse
  std::size_t buffers = 0;
  std::size_t persistent_bytes = 0;  // inputs and graph outputs owned by the executable
};

struct KernelProfile {
  const ir::Node* node;
  std::string kernel;
  std::int64_t calls = 0;
  double seconds = 0.0;
  std::int64_t flops = 0;     // per call, from the op's count (0: the op has none)
  std::int64_t elements = 0;  // per call: node_elements
  /// The part of `seconds` the kernel spent waiting for another process with nothing to do
  /// (a receive whose message had not arrived: the pipeline's bubble), as it noted it
  /// (core/idle.hpp).
  double idle_seconds = 0.0;
  /// The first call's time (within `seconds`): the run that first writes the memory plan's
  /// buffers, paying the operating system's page faults, and runs each library primitive for
  /// the first time. Several times a later call's for the memory-bound kernels of a large plan.
  double first_seconds = 0.0;
};

/// One kernel call on the timeline: the node, the thread that ran it (its replica in a parallel
/// section, else 0) and its start and length in microseconds of trace_clock_us(). A call that
/// waited for another process first (core/idle.hpp) is two events: the wait (idle) and then the
/// rest of the call.
struct TraceEvent {
  const ir::Node* node;
  int thread;
  double begin_us;
  double duration_us;
  bool idle = false;
};

/// Microseconds of the monotonic clock, the same in every process of one machine.
double trace_clock_us();

class Executable {
 public:
  explicit Executable(const ir::Graph& g, CompileOptions options = {});
  /// Prints subnormal_report() under MINIDL_VERBOSE=denormals.
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  /// Runs every kernel once, in graph order (parallel sections concurrently, see above).
  void run();

  /// The buffer of the graph input called name: write the batch here before run().
  const Tensor& input(std::string_view name) const;
  /// The tensor holding v after run(): graph outputs, inputs, parameters and state only
  /// (other values share reused buffers).
  const Tensor& value(const ir::Value* v) const;

  const MemoryPlan& memory() const { return plan_; }
  /// One line per node: the kernel chosen.
  std::string kernel_table() const;
  const std::vector<KernelProfile>& profile() const { return profile_; }
  /// The recorded kernel calls in the order they ended per thread; empty unless
  /// CompileOptions::trace. dropped_events() counts the calls past the limit.
  std::vector<TraceEvent> trace() const;
  std::size_t dropped_events() const;

  /// Per node output, its subnormal counts (CompileOptions::count_denormals; empty otherwise).
  std::vector<SubnormalCount> subnormals() const;
  /// How many times run() ran (the runs subnormals() counts).
  std::int64_t counted_runs() const { return runs_; }
  /// The floating-point operations of one run as the ops count them (ir::OpDef::flops: the
  /// products and the convolutions, forward and backward; the memory-bound nodes count none).
  std::int64_t flops_per_run() const { return flops_per_run_; }
  /// A table of the outputs that held subnormals, most first, and a total line.
  std::string subnormal_report() const;

 private:
  struct Step {
    const ir::Node* node;
    ir::Kernel kernel;
    std::vector<Tensor> in, out;
    ir::KernelArgs args;
    std::string kernel_name;
    double injected = -1.0;  // >= 0: seconds spent instead of running the kernel
  };
  // Steps [begin, end) form a parallel section of `replicas` threads.
  struct Section {
    std::size_t begin, end;
    int replicas;
    /// A node of the section communicates (tensor parallelism's collectives inside each
    /// replica): MPI is called from the main thread only, so the replicas run one after another
    /// there, in replica order (every rank issues the collectives in the same order).
    bool serial = false;
  };
  /// One step per node that runs a kernel: its kernel (see ir::kernel_for), made for the node.
  void make_steps(const ir::Graph& g);
  void plan_memory(const ir::Graph& g);
  void find_sections();
  /// Runs step i's kernel, or spends its injected time.
  void run_step(std::size_t i);
  /// After step i's kernel: the numerics check and the subnormal count, where asked.
  void check_step(std::size_t i);
  void run_steps(std::size_t begin, std::size_t end, int replica);
  void run_section(const Section& s);
  void count_step_subnormals(std::size_t step);

  CompileOptions options_;
  std::vector<Step> steps_;
  std::vector<int> step_replica_;  // per step: its replica, or -1 outside every section
  std::vector<Section> sections_;
  std::vector<std::shared_ptr<Storage>> buffers_;  // transient pool and owned persistent values
  std::vector<std::pair<const ir::Value*, Tensor>> tensors_;  // every value's view
  std::vector<std::pair<std::string, Tensor>> inputs_;
  std::vector<const ir::Value*> readable_;
  std::vector<KernelProfile> profile_;
  // One event list per thread of a section (index 0 also for steps outside sections), so that
  // replicas record without locking.
  struct TraceBuffer {
    std::vector<TraceEvent> events;
    std::size_t dropped = 0;
  };
  std::vector<TraceBuffer> trace_;
  // Per step, per output (CompileOptions::count_denormals); a step's counts are written only by
  // the thread that runs it.
  std::vector<std::vector<SubnormalCount>> subnormals_;
  std::int64_t runs_ = 0;
  std::int64_t flops_per_run_ = 0;
  MemoryPlan plan_;
};

}  // namespace minidl::runtime
