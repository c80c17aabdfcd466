// The flag table of run_training_app: one row per flag (minidl/app/flags.cpp) stating its
// name, the AppConfig field it sets, its help, the values it accepts, whether a resumed run must
// repeat it (its checkpoint setting) and its key in the metrics' "config" record. Parsing,
// --help, the checkpoint's settings, the metrics record and the Markdown reference
// (docs/flags.md, --help-markdown) are all read from it: adding a flag is adding a row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "minidl/app/app.hpp"
#include "minidl/io/checkpoint.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace minidl {

/// What a run knows beyond its flags, for the settings and records that state it.
struct RunFacts {
  std::string program;
  std::string model;  // nn::Module::describe()
  std::int64_t parameters = 0;
  std::int64_t train_samples = 0;  // after --train-limit
  std::int64_t test_samples = 0;   // after --test-limit
  int ranks = 1;
  int threads = 1;           // OpenMP threads per rank, as --threads left them
  std::string optimizer;     // optim::Optimizer::describe()
  std::string schedule;      // optim::LrSchedule::describe()
  std::string resumed_from;  // the checkpoint file this run continues; empty: none
  int first_epoch = 1;
};

/// Declares on app every flag the table offers for config (per-example flags such as --loss
/// only where config allows them), bound to config's fields; config's values are the defaults.
void add_flags(CLI::App& app, AppConfig& config);

/// The settings a checkpoint records and a resuming run is checked against
/// (checkpoint::check_settings): the table's rows with a checkpoint key, in table order.
std::vector<checkpoint::Setting> checkpoint_settings(const AppConfig& config, const RunFacts& run);

/// The object of the metrics' first record, {"config": <this>}: the table's rows with a metrics
/// key, as one line of JSON.
std::string metrics_config(const AppConfig& config, const RunFacts& run);

/// Every flag's value that all ranks of a job must share, one "--flag value" line each (the
/// example's own flags too): all but the rows marked per_rank (--data, --threads, --quiet). The
/// preflight compares it.
std::string ranks_must_agree(const AppConfig& config, const std::vector<AppFlag>& own = {});

/// The flag reference in Markdown with config's defaults: a table of every flag (name, default,
/// allowed values, what a resume needs of it, metrics key, help) and of the example's own
/// (AppHooks::flags), then the settings recorded without a flag. scripts/flags-doc assembles
/// docs/flags.md from it.
std::string flags_markdown(const AppConfig& config, const std::vector<AppFlag>& own = {});

}  // namespace minidl
