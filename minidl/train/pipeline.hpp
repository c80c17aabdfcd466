// Pipeline parallelism: the model's forward cut into stages, one per rank, each rank running
// its stage's forward and backward of every micro-batch in the order of a schedule, the
// activations sent forward and their gradients backward by send / recv ops in the graph.
//
// The micro-batches are the replicas of compile_step (deterministic mode: its micro-shards), so
// the parameters' gradients are summed over them by the same tree as in one process, and a
// pipelined run in deterministic mode ends with the bits of the one-process run.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace minidl::parallel {
class Communicator;
}

namespace minidl::train {

/// One entry of a rank's schedule.
struct PipelineAction {
  enum class Kind {
    Forward,
    Backward,
    SendActivation,
    RecvActivation,
    SendGradient,
    RecvGradient,
    Update
  };
  Kind kind = Kind::Forward;
  int micro = -1;  // the micro-batch (-1 for Update)
  int peer = -1;   // the stage sent to or received from (-1: none)
};

/// "F3", "B0", "send-act 2 -> stage 1", "update".
std::string describe(const PipelineAction& a);

/// The actions of every stage for `micro` micro-batches: "gpipe" (every forward, then every
/// backward in reverse order) or "1f1b" (P - 1 - s warm-up forwards, then one forward and one
/// backward in turn, then the remaining backwards). Throws on another name.
std::vector<std::vector<PipelineAction>> make_schedule(const std::string& kind, int stages,
                                                       int micro);

/// Checks a set of stage schedules: every forward and backward of every micro-batch once, a
/// micro-batch's backward after its forward, its forward after it received the activation and
/// its backward after it received the gradient, sends after what they send is computed, and a
/// replay of all the lists with blocking sends and receives (a send waits for its matching
/// receive) that ends with every list done. Throws minidl::Error naming the stage, the action
/// and the partner on the first problem. Returns the most micro-batches whose activations a
/// stage holds at once (its stash slots), per stage.
std::vector<int> check_schedule(const std::vector<std::vector<PipelineAction>>& schedule,
                                int micro);

/// The schedule as text, one line per action and stage ("stage 0: F0 send-act0 ...").
std::string format_schedule(const std::vector<std::vector<PipelineAction>>& schedule);

struct PipelineOptions {
  int stages = 1;  // 1: no pipeline
  int stage = 0;   // this rank's
  /// The ranks of the job, stage s on rank s: the peers of the send / recv ops.
  parallel::Communicator* comm = nullptr;
  std::string schedule = "gpipe";  // or "1f1b"
  /// Where the stages end, as the name of the node whose output is the last of a stage (one
  /// per boundary, in order), e.g. set by the user between children of a Sequential; empty:
  /// cut automatically, balancing `balance`.
  std::vector<std::string> boundaries;
  /// What the automatic cut balances: "time" (each forward node's time with its backward's,
  /// profiled in a few one-process steps on a micro-batch: train/stage_balance.hpp), "flops"
  /// (the forward's FLOPs as the ops count them) or "params" (parameter elements); each falls
  /// back to the next when it has nothing to count.
  std::string balance = "time";
  /// With "time": the profiled table, measured when the first training program is compiled and
  /// kept for the others (copies of the options share it).
  std::shared_ptr<std::optional<std::map<std::string, double>>> node_seconds =
      std::make_shared<std::optional<std::map<std::string, double>>>();
};

}  // namespace minidl::train
