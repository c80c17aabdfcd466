// Training checkpoints: the model's parameters and buffers, the optimizer's state and the
// trainer's position in one .safetensors file, whose "__metadata__" holds the position and the
// run's settings. A run resumed from a checkpoint ends with the very same parameters as one that
// never stopped, when both have the same layout (ranks, threads, backend).
//
// File contents: every parameter and buffer under its model name ("fc1.weight"), every optimizer
// state
// tensor as "optimizer.<name>" ("optimizer.fc1.weight.momentum_buffer"), and the metadata
// "minidl.checkpoint" (kVersion), "epoch" (whole epochs done), "epoch_step" and "position"
// (steps and samples done of the next epoch's order), "step" (training steps since the start:
// the dropout key), "epoch_samples", "epoch_loss_sum", "epoch_correct" (that epoch's statistics
// so far, over all ranks; the sums as exact hexadecimal floats), plus the run's settings.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "minidl/core/tensor.hpp"

namespace minidl::checkpoint {

/// The metadata value of "minidl.checkpoint": the version of what a checkpoint holds.
inline constexpr std::string_view kVersion = "1";
/// Optimizer state tensor "<name>" is stored as "optimizer.<name>".
inline constexpr std::string_view kOptimizerPrefix = "optimizer.";

using Metadata = std::map<std::string, std::string>;

/// Where training stands between two steps: what a checkpoint records and Trainer::resume
/// restores (as TrainerPosition), so that training goes on exactly as if it had not stopped.
struct Position {
  int epoch = 1;                 // the epoch in progress, or the next one when epoch_step is 0
  std::int64_t epoch_step = 0;   // steps done in that epoch
  std::int64_t next_sample = 0;  // place in the epoch's sample order of the next batch's start
  std::int64_t step = 0;         // training steps since training began (dropout's key)
  // The epoch's statistics so far, summed over the ranks (for its summary).
  double loss_sum = 0.0;
  double correct = 0.0;
  std::int64_t samples = 0;
};

/// "ckpt-e0001-s000012.safetensors": taken after `epochs` whole epochs and `steps` steps of the
/// next one. The names sort in the order they were taken.
std::string file_name(int epochs, std::int64_t steps);

/// The checkpoint files in dir (named as file_name makes them), oldest first.
std::vector<std::string> list(const std::string& dir);

/// The checkpoints in dir taken after `epochs` whole epochs and `steps` steps of the next,
/// oldest first.
std::vector<std::string> list_after(const std::string& dir, int epochs, std::int64_t steps);

/// path itself when it is a file; the newest checkpoint in it when it is a directory.
std::string resolve(const std::string& path);

/// The tensors of a checkpoint, each group by name.
struct Tensors {
  NamedTensors parameters;       // the model's trained tensors
  NamedTensors buffers;          // the model's state that is not trained (running statistics)
  NamedTensors optimizer_state;  // stored as "optimizer.<name>"
};

/// Writes dir/file_name(...) for position pos: a temporary file in dir, fsync, rename. Then
/// removes all but the newest `keep` checkpoints of dir (and stale temporary files of killed
/// writers). settings are stored in the metadata for check_settings. Returns the path.
std::string save(const std::string& dir, const Position& pos, const Tensors& tensors,
                 const Metadata& settings, int keep);

struct Loaded {
  std::string path;
  Position position;
  Metadata metadata;  // all of it: position, settings, format
};

/// Reads path and checks its tensors against `into` by name, shape and dtype; any difference
/// throws one error naming the file and, for each tensor, what was expected and what was found.
/// Then copies the tensors in.
Loaded load(const std::string& path, const Tensors& into);

/// The position recorded in a checkpoint's metadata m (read from path, named in errors);
/// throws if the format version is another or the position is missing or inconsistent.
Position position_from_metadata(const std::string& path, const Metadata& m);

/// How a setting of the resuming run may differ from the checkpoint's.
enum class Rule {
  Same,          // must be equal: another value makes another model
  SameMidEpoch,  // must be equal inside an epoch (the rest of the epoch would follow another
                 // order or batching); at an epoch boundary another value only gets a note
  Note,          // may differ (another layout, learning rate...): a note says so
};

struct Setting {
  std::string key;    // the metadata key
  std::string value;  // this run's value
  Rule rule = Rule::Note;
  std::string flag;  // what the user changes: "--seed"
};

/// The settings as metadata, to pass to save().
Metadata settings_metadata(const std::vector<Setting>& settings);

/// Compares this run's settings with the checkpoint's. Throws one error listing every setting
/// that must not differ; returns a note for each other difference. A setting the checkpoint
/// does not record is not compared.
std::vector<std::string> check_settings(const Loaded& ckpt, const std::vector<Setting>& settings);

}  // namespace minidl::checkpoint
