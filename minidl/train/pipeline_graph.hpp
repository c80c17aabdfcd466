// The step compiler's pipeline pieces (train/step.cpp): where the forward is cut into stages,
// the send / recv ops at the cuts, and the node order that follows a stage's schedule.
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "minidl/ir/graph.hpp"
#include "minidl/train/pipeline.hpp"

namespace minidl::train {

/// One micro-batch's forward in the graph: its nodes [begin, end) in graph order (those the
/// model's forward added) and its output.
struct ForwardRange {
  std::size_t begin = 0, end = 0;
  ir::Value* output = nullptr;
};

/// The stage of every node of g: the forward of each micro-batch cut after the nodes named by
/// `boundaries` (or automatically, balancing `balance`: "time", each forward node's seconds
/// in `node_seconds` (by name; absent: 0); "flops", the forward's FLOPs as the ops count them;
/// "params", the parameters' elements; each falling back to the next when it counts nothing)
/// into `stages` stages, everything after the
/// forwards (the loss) in the last, a source in the stage of its readers, a state update with
/// its computed input. `summary` gets one line: the cut, each stage's share and the measure. Throws
/// when the forward cannot be cut so (naming the boundary, or the stage count and the places it
/// could be cut).
std::unordered_map<const ir::Node*, int> assign_stages(
    const ir::Graph& g, const std::vector<ForwardRange>& forwards, int stages,
    const std::vector<std::string>& boundaries, std::string* summary,
    const std::map<std::string, double>* node_seconds = nullptr,
    const std::string& balance = "time");

/// What the cut leaves on this rank's stage.
struct StageCut {
  /// Per micro-batch: the activations this stage receives (their recv outputs), and the ones it
  /// sends to the next stage.
  std::vector<std::vector<ir::Value*>> received, sent;
};

/// Keeps the nodes of `stage` alive: sends each value the next stage reads (send op, to rank
/// next_rank) and replaces each value this stage reads from the previous one by a recv (from
/// prev_rank). The micro-batch of each node is its replica. Other stages' nodes are left for
/// dead-code elimination (nothing of this stage reads them any more).
StageCut cut_stage(ir::Graph& g, const std::unordered_map<const ir::Node*, int>& stage_of,
                   int stage, int group, int prev_rank, int next_rank);

/// Adds the recv of the gradient of each sent value (from next_rank): the seeds of this stage's
/// backward, as (value, gradient) pairs.
std::vector<std::pair<ir::Value*, ir::Value*>> receive_gradients(ir::Graph& g, const StageCut& cut,
                                                                 int stage, int next_rank,
                                                                 int group);

/// Sends the gradient of each received value back (to prev_rank).
void send_gradients(ir::Graph& g, const StageCut& cut, const std::vector<ir::Value*>& grads,
                    int stage, int prev_rank, int group);

/// Orders g's nodes by the stage's actions: each micro-batch's forward and backward nodes (its
/// replica, by phase) and its sends and receives where the schedule puts them; work shared by
/// all micro-batches first, and what joins several (the gradients' sums, the updates) last. The
/// sends and receives leave their replica, so the runtime runs them on the main thread between
/// the micro-batches' sections.
void order_by_schedule(ir::Graph& g, const std::vector<PipelineAction>& actions);

}  // namespace minidl::train
