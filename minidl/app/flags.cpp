#include "minidl/app/flags.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <type_traits>

#include "minidl/core/error.hpp"
#include "minidl/core/text.hpp"
#include "minidl/ops/precision.hpp"
#include "minidl/train/batch.hpp"

namespace minidl {
namespace {

using Json = nlohmann::json;
using Rule = checkpoint::Rule;

/// A value as JSON; text that is not valid UTF-8 (a path is bytes) escaped, not refused.
template <typename T>
Json json_of(const T& v) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    return Json(utf8_escaped(v));
  } else {
    return Json(v);
  }
}

/// A value's kind in the reference's words.
template <typename T>
constexpr std::string_view kind_of() {
  if constexpr (std::is_same_v<T, bool>) return "switch";
  if constexpr (std::is_integral_v<T>) return "integer";
  if constexpr (std::is_floating_point_v<T>) return "number";
  return "text";
}

/// The AppConfig member a flag sets: how CLI11 binds it, and its value as text (checkpoint
/// settings, defaults) and as JSON (the metrics record). A bool member is a switch.
struct Field {
  Field() = default;
  // Implicit, so that a row says `.field = &AppConfig::lr`.
  template <typename T>
  Field(T AppConfig::*member)  // NOLINT(google-explicit-constructor)
      : kind(kind_of<T>()) {
    add = [member](CLI::App& app, const std::string& name, const std::string& help,
                   AppConfig& c) -> CLI::Option* {
      if constexpr (std::is_same_v<T, bool>) {
        return app.add_flag(name, c.*member, help);
      } else {
        return app.add_option(name, c.*member, help);
      }
    };
    text = [member](const AppConfig& c) { return fmt::format("{}", c.*member); };
    json = [member](const AppConfig& c) { return json_of(c.*member); };
  }
  bool is_switch() const { return kind == "switch"; }

  std::function<CLI::Option*(CLI::App&, const std::string&, const std::string&, AppConfig&)> add;
  std::function<std::string(const AppConfig&)> text;
  std::function<Json(const AppConfig&)> json;
  std::string_view kind;
};

/// The values a flag accepts: a CLI11 validator, and the same in words for the reference. Both
/// may depend on the example's configuration (its datasets, its losses).
struct Check {
  std::function<CLI::Validator(const AppConfig&)> validator;  // null: any value of the field
  std::function<std::string(const AppConfig&)> words;         // null: the field's kind
};

template <typename T>
Check range(T lo, T hi) {
  return {[=](const AppConfig&) -> CLI::Validator { return CLI::Range(lo, hi); },
          [=](const AppConfig&) { return fmt::format("{} {} to {}", kind_of<T>(), lo, hi); }};
}

/// An integer of at least 0 (CLI11's NonNegativeNumber, whose message the tests expect).
Check non_negative() {
  return {[](const AppConfig&) -> CLI::Validator { return CLI::NonNegativeNumber; },
          [](const AppConfig&) { return std::string("integer 0 or more"); }};
}

std::string words_of(const std::vector<std::string>& values) {
  std::string s;
  for (const std::string& v : values) s += (s.empty() ? "`" : ", `") + v + "`";
  return s;
}

/// One of the values that values(config) lists.
Check one_of(std::function<std::vector<std::string>(const AppConfig&)> values) {
  return {[=](const AppConfig& c) -> CLI::Validator { return CLI::IsMember(values(c)); },
          [=](const AppConfig& c) { return words_of(values(c)); }};
}

Check one_of(std::vector<std::string> values) {
  return one_of([values = std::move(values)](const AppConfig&) { return values; });
}

/// The values --backend accepts: onednn only in builds with oneDNN. The reference states both,
/// so that it does not depend on the build.
Check backends() {
  return {[](const AppConfig&) -> CLI::Validator {
            std::vector<std::string> b{"native"};
            if (MINIDL_WITH_ONEDNN) b.emplace_back("onednn");
            return CLI::IsMember(b);
          },
          [](const AppConfig&) { return std::string("`native`, `onednn` (builds with oneDNN)"); }};
}

/// The values --precision accepts; bf16 only where kernels can compute in it
/// (ops::bf16_unavailable says why not: the CPU, or a build without oneDNN).
Check precisions() {
  return {[](const AppConfig&) -> CLI::Validator {
            return CLI::Validator(
                [](std::string& v) -> std::string {
                  if (v != "f32" && v != "bf16") return "expected f32 or bf16";
                  if (v == "f32") return "";
                  if (std::string why = ops::bf16_unavailable(); !why.empty()) return "bf16 " + why;
                  return "";
                },
                "");
          },
          [](const AppConfig&) {
            return std::string(
                "`f32`, `bf16` (oneDNN kernels on a CPU with AVX512-BF16 or "
                "AMX-BF16)");
          }};
}

/// The values --augment accepts (train::Augment::parse, whose message names them).
Check augmentations() {
  return {[](const AppConfig&) -> CLI::Validator {
            return CLI::Validator(
                [](std::string& v) -> std::string {
                  try {
                    (void)train::Augment::parse(v);
                  } catch (const Error& e) {
                    return e.what();
                  }
                  return "";
                },
                "");
          },
          [](const AppConfig&) {
            return std::string("`none` (or empty), `crop`, `flip`, `crop,flip`");
          }};
}

/// Whether and how a checkpoint records the flag, and so what a resumed run must repeat
/// (checkpoint::Rule: Same, SameMidEpoch, or Note for a setting that may differ).
struct Resume {
  std::string_view key;  // the checkpoint's metadata key; empty: not recorded
  Rule rule = Rule::Note;
  std::string_view what = {};  // names it in check_settings' notes and errors; empty: the flag
  // The recorded value; null: the field's.
  std::function<std::string(const AppConfig&, const RunFacts&)> value = {};
  // The flag is recorded as part of the setting `key` of another row, which states the rule,
  // the value and, in `what`, every flag that shapes it.
  bool part = false;
};

Resume part_of(std::string_view key) { return {.key = key, .part = true}; }

/// The flag's key in the metrics' "config" record.
struct Metric {
  std::string_view key;  // empty: not in the record
  // The recorded value; null: the field's.
  std::function<Json(const AppConfig&, const RunFacts&)> value = {};
};

/// Whether an example offers the flag at all; the others still record its default.
struct Offered {
  std::function<bool(const AppConfig&)> test;  // null: every example
  std::string_view when = {};                  // the condition in the reference's words
};

/// One row: a flag, or (name empty, no field) a fact of the run that is recorded as well.
struct Flag {
  std::string_view name;  // "--batch-size"
  Field field;
  std::string_view help;
  Check check = {};
  Resume resume = {};
  Metric metric = {};
  Offered offered = {};
  std::vector<std::string_view> needs = {};     // flags without which it is refused
  std::vector<std::string_view> excludes = {};  // flags with which it is refused
  // May differ between the ranks of one job (a path or a count of this host's own); every
  // other flag must agree, which the preflight checks (ranks_must_agree).
  bool per_rank = false;

  bool is_flag() const { return !name.empty(); }
  bool offered_by(const AppConfig& c) const { return !offered.test || offered.test(c); }
};

/// A fact of the run, as a setting's text and as JSON.
template <typename T>
auto fact_text(T RunFacts::*m) {
  return [m](const AppConfig&, const RunFacts& r) { return fmt::format("{}", r.*m); };
}
template <typename T>
auto fact_json(T RunFacts::*m) {
  return [m](const AppConfig&, const RunFacts& r) { return json_of(r.*m); };
}

/// The table. A new flag is one row: its AppConfig field, help, check, checkpoint key and rule,
/// metrics key. Then scripts/flags-doc regenerates docs/flags.md (ctest's docs.flags fails until
/// it does).
std::vector<Flag> make_table() {
  using C = const AppConfig&;
  using F = const RunFacts&;
  return {
      // Facts of the run that no flag sets.
      {.help = "the program's name", .metric = {"program", fact_json(&RunFacts::program)}},
      {.help = "the model, as nn::Module::describe() states it",
       .resume = {"model", Rule::Same, "the model", fact_text(&RunFacts::model)},
       .metric = {"model", fact_json(&RunFacts::model)}},
      {.help = "the number of model parameters",
       .metric = {"parameters", fact_json(&RunFacts::parameters)}},
      {.help = "the number of ranks",
       .resume = {"ranks", Rule::Note, "the number of ranks", fact_text(&RunFacts::ranks)},
       .metric = {"ranks", fact_json(&RunFacts::ranks)}},
      {.help = "whether the example standardises every channel (AppConfig::normalize)",
       .metric = {"normalize", [](C c, F) { return Json(c.normalize); }}},
      {.help = "the epoch the run starts with (after --resume: the checkpoint's)",
       .metric = {"first_epoch", fact_json(&RunFacts::first_epoch)}},

      // The flags, in the order of --help.
      {.name = "--data",
       .field = &AppConfig::data,
       .help = "dataset directory (default: data/<dataset>)",
       .per_rank = true},
      {.name = "--dataset",
       .field = &AppConfig::dataset,
       .help = "dataset",
       .check = one_of([](C c) { return c.datasets; }),
       .resume = {"dataset", Rule::SameMidEpoch},
       .metric = {"dataset"}},
      {.name = "--hidden",
       .field = &AppConfig::hidden,
       .help = "hidden layer sizes, comma-separated; \"\" for none"},
      {.name = "--activation",
       .field = &AppConfig::activation,
       .help = "hidden activation",
       .check = one_of(nn::activation_names())},
      {.name = "--epochs",
       .field = &AppConfig::epochs,
       .help = "epochs",
       .check = range(1, 100000),
       .resume = part_of("lr_schedule"),
       .metric = {"epochs"}},
      {.name = "--batch-size",
       .field = &AppConfig::batch_size,
       .help = "batch size",
       .check = range<std::int64_t>(1, 1 << 20),
       .resume = {"batch_size", Rule::SameMidEpoch},
       .metric = {"batch_size"}},
      {.name = "--accumulate",
       .field = &AppConfig::accumulate,
       .help = "gradient accumulation: micro-steps of --batch-size samples per optimizer step",
       .check = range<std::int64_t>(1, 1 << 20),
       .resume = {"accumulate", Rule::SameMidEpoch},
       .metric = {"accumulate"}},
      {.name = "--lr",
       .field = &AppConfig::lr,
       .help = "learning rate",
       .check = range(1e-12, 1e6),
       .resume = {"lr"},
       .metric = {"lr"}},
      {.name = "--momentum",
       .field = &AppConfig::momentum,
       .help = "SGD momentum in [0, 1)",
       .check = range(0.0, 0.999999),
       .resume = {"momentum"},
       .metric = {"momentum"}},
      {.name = "--optimizer",
       .field = &AppConfig::optimizer,
       .help = "optimizer",
       .check = one_of({"sgd", "adamw"}),
       .resume = {"optimizer", Rule::Same},
       .metric = {"optimizer", fact_json(&RunFacts::optimizer)}},
      {.name = "--nesterov",
       .field = &AppConfig::nesterov,
       .help = "Nesterov momentum (SGD, needs --momentum)",
       .resume = {"nesterov"},
       .metric = {"nesterov"}},
      {.name = "--weight-decay",
       .field = &AppConfig::weight_decay,
       .help = "weight decay: added to the gradient (SGD) or decoupled (AdamW)",
       .check = range(0.0, 1e6),
       .resume = {"weight_decay"},
       .metric = {"weight_decay"}},
      {.name = "--beta1",
       .field = &AppConfig::beta1,
       .help = "AdamW's first-moment decay in [0, 1)",
       .check = range(0.0, 0.999999999),
       .resume = {"betas", Rule::Note, "--beta1/--beta2",
                  [](C c, F) { return fmt::format("{},{}", c.beta1, c.beta2); }}},
      {.name = "--beta2",
       .field = &AppConfig::beta2,
       .help = "AdamW's second-moment decay in [0, 1)",
       .check = range(0.0, 0.999999999),
       .resume = part_of("betas")},
      {.name = "--eps",
       .field = &AppConfig::eps,
       .help = "AdamW's denominator term",
       .check = range(1e-30, 1.0),
       .resume = {"eps"}},
      {.name = "--lr-schedule",
       .field = &AppConfig::lr_schedule,
       .help = "learning rate per step: constant, step (x gamma every --lr-step-epochs) or "
               "cosine (to 0 at the last step)",
       .check = one_of({"constant", "step", "cosine"}),
       .resume = {"lr_schedule", Rule::Note,
                  "--lr-schedule, --lr-step-epochs, --lr-gamma, --warmup-steps, --epochs",
                  [](C c, F) {
                    return fmt::format("{} step_epochs={} gamma={} warmup={} epochs={}",
                                       c.lr_schedule, c.lr_step_epochs, c.lr_gamma, c.warmup_steps,
                                       c.epochs);
                  }},
       .metric = {"lr_schedule", fact_json(&RunFacts::schedule)}},
      {.name = "--lr-step-epochs",
       .field = &AppConfig::lr_step_epochs,
       .help = "the step schedule's period in epochs",
       .check = range<std::int64_t>(1, 1 << 30),
       .resume = part_of("lr_schedule")},
      {.name = "--lr-gamma",
       .field = &AppConfig::lr_gamma,
       .help = "the step schedule's factor",
       .check = range(1e-12, 1e6),
       .resume = part_of("lr_schedule")},
      {.name = "--warmup-steps",
       .field = &AppConfig::warmup_steps,
       .help = "linear warm-up over the first N steps (any schedule)",
       .check = range<std::int64_t>(0, std::int64_t{1} << 40),
       .resume = part_of("lr_schedule")},
      {.name = "--clip-grad-norm",
       .field = &AppConfig::clip_grad_norm,
       .help = "clip the global gradient norm to X after the reduction (0: off)",
       .check = range(0.0, 1e12),
       .resume = {"clip_grad_norm"},
       .metric = {"clip_grad_norm"}},
      {.name = "--loss",
       .field = &AppConfig::loss,
       .help = "loss",
       .check = one_of([](C c) { return c.losses; }),
       .resume = {"loss", Rule::Note, "--loss, --label-smoothing",
                  [](C c, F) {
                    return fmt::format("{} label_smoothing={}", c.loss, c.label_smoothing);
                  }},
       .metric = {"loss"},
       .offered = {[](C c) { return c.losses.size() > 1; },
                   "where the example allows more than one loss (AppConfig::losses)"}},
      {.name = "--label-smoothing",
       .field = &AppConfig::label_smoothing,
       .help = "cross-entropy's label smoothing in [0, 1]",
       .check = range(0.0, 1.0),
       .resume = part_of("loss"),
       .metric = {"label_smoothing"},
       .offered = {[](C c) {
                     return std::find(c.losses.begin(), c.losses.end(), "cross-entropy") !=
                            c.losses.end();
                   },
                   "where the example allows cross-entropy"}},
      {.name = "--max-steps",
       .field = &AppConfig::max_steps,
       .help = "stop after N training steps, then evaluate and save (0: train every epoch)",
       .check = range<std::int64_t>(0, std::int64_t{1} << 40)},
      {.name = "--seed",
       .field = &AppConfig::seed,
       .help = "random seed (initialisation and shuffling)",
       .resume = {"seed", Rule::SameMidEpoch},
       .metric = {"seed"}},
      {.name = "--threads",
       .field = &AppConfig::threads,
       .help = "OpenMP threads (0: OMP_NUM_THREADS or all cores)",
       .check = range(0, 1024),
       .resume = {"threads", Rule::Note, "the number of threads (--threads)",
                  fact_text(&RunFacts::threads)},
       .metric = {"threads", fact_json(&RunFacts::threads)},
       .per_rank = true},
      {.name = "--backend",
       .field = &AppConfig::backend,
       .help = "preferred kernels; ops that the backend lacks fall back to native",
       .check = backends(),
       .resume = {"backend"},
       .metric = {"backend"}},
      {.name = "--precision",
       .field = &AppConfig::precision,
       .help = "arithmetic of the convolutions and matrix products: f32, or bf16 (mixed precision: "
               "bf16 factors on the CPU's AMX or AVX512-BF16 units, f32 accumulation; activations "
               "between bf16 kernels stored in bf16; parameters, gradients, their reduction and "
               "the loss stay f32)",
       .check = precisions(),
       .resume = {"precision"},
       .metric = {"precision"}},
      {.name = "--denormals",
       .field = &AppConfig::denormals,
       .help = "subnormal numbers (|x| < 2^-126): flush sets flush-to-zero and "
               "denormals-are-zero on every thread (they become 0, avoiding the CPU's slow path "
               "for them); keep computes them (IEEE gradual underflow)",
       .check = one_of({"flush", "keep"}),
       .metric = {"denormals"}},
      {.name = "--train-limit",
       .field = &AppConfig::train_limit,
       .help = "use the first N training samples (0: all)",
       .check = non_negative(),
       .resume = {"train_samples", Rule::SameMidEpoch, "the training set size (--train-limit)",
                  fact_text(&RunFacts::train_samples)},
       .metric = {"train_samples", fact_json(&RunFacts::train_samples)}},
      {.name = "--test-limit",
       .field = &AppConfig::test_limit,
       .help = "use the first N test samples (0: all)",
       .check = non_negative(),
       .metric = {"test_samples", fact_json(&RunFacts::test_samples)}},
      {.name = "--metrics",
       .field = &AppConfig::metrics,
       .help = "write JSON lines to FILE: {\"config\": {...}} with the run's settings, then one "
               "record per epoch"},
      {.name = "--save",
       .field = &AppConfig::save,
       .help = "save the trained parameters to FILE.safetensors"},
      {.name = "--init",
       .field = &AppConfig::init,
       .help = "start from the parameters in FILE.safetensors"},
      {.name = "--dump-graph",
       .field = &AppConfig::dump_graph,
       .help = "write the training graph to FILE (.dot or .txt)"},
      {.name = "--no-shuffle",
       .field = &AppConfig::no_shuffle,
       .help = "keep the data in file order every epoch",
       .resume = {"shuffle", Rule::SameMidEpoch, "shuffling (--no-shuffle)",
                  [](C c, F) { return fmt::format("{}", !c.no_shuffle); }},
       .metric = {"shuffle", [](C c, F) { return Json(!c.no_shuffle); }}},
      {.name = "--quiet",
       .field = &AppConfig::quiet,
       .help = "print nothing but errors and one final line (test loss and accuracy)",
       .per_rank = true},
      {.name = "--checkpoint-dir",
       .field = &AppConfig::checkpoint_dir,
       .help = "write checkpoints (parameters, optimizer state, position) to DIR, every epoch "
               "unless --checkpoint-every or --checkpoint-every-steps says otherwise"},
      {.name = "--checkpoint-every",
       .field = &AppConfig::checkpoint_every,
       .help = "checkpoint every N epochs",
       .check = range(1, 100000),
       .needs = {"--checkpoint-dir"}},
      {.name = "--checkpoint-every-steps",
       .field = &AppConfig::checkpoint_every_steps,
       .help = "checkpoint every N training steps",
       .check = range<std::int64_t>(1, std::int64_t{1} << 40),
       .needs = {"--checkpoint-dir"}},
      {.name = "--checkpoint-keep",
       .field = &AppConfig::checkpoint_keep,
       .help = "keep the newest K checkpoints",
       .check = range(1, 1000000),
       .needs = {"--checkpoint-dir"}},
      {.name = "--resume",
       .field = &AppConfig::resume,
       .help = "continue from a checkpoint FILE, or from the newest checkpoint in a directory",
       .metric = {"resume",
                  [](C, F r) { return r.resumed_from.empty() ? Json() : json_of(r.resumed_from); }},
       .excludes = {"--init"}},
      {.name = "--deterministic",
       .field = &AppConfig::deterministic,
       .help = "bitwise the same parameters for any ranks x threads: micro-shards summed in one "
               "fixed tree order",
       .resume = {"deterministic"},
       .metric = {"deterministic"}},
      {.name = "--micro-batch",
       .field = &AppConfig::micro_batch,
       .help = "samples per micro-shard in deterministic mode; must divide --batch-size",
       .check = range<std::int64_t>(1, 1 << 20),
       .resume = {"micro_batch",
                  Rule::Note,
                  {},
                  [](C c, F) { return fmt::format("{}", c.deterministic ? c.micro_batch : 0); }},
       .metric = {"micro_batch", [](C c, F) { return Json(c.deterministic ? c.micro_batch : 0); }},
       .needs = {"--deterministic"}},
      {.name = "--thread-mode",
       .field = &AppConfig::thread_mode,
       .help = "use of each rank's threads: data-parallel replicas or parallel kernels",
       .check = one_of({"replicas", "intra-op"}),
       .resume = {"thread_mode"},
       .metric = {"thread_mode",
                  [](C c, F) { return Json(c.deterministic ? "deterministic" : c.thread_mode); }},
       .excludes = {"--deterministic"}},
      {.name = "--reduce",
       .field = &AppConfig::reduce,
       .help = "gradient reduction across ranks (with --deterministic: allreduce or "
               "hierarchical, the same bits)",
       .check = one_of({"allreduce", "root", "hierarchical"}),
       .resume = {"reduce"},
       .metric = {"reduce"}},
      {.name = "--bucket-mb",
       .field = &AppConfig::bucket_mb,
       .help = "gradient bucket size in MiB (0: one reduction per gradient)",
       .check = range(0.0, 1024.0),
       .resume = {"bucket_mb"},
       .metric = {"bucket_mb"}},
      {.name = "--overlap",
       .field = &AppConfig::overlap,
       .help = "start each gradient bucket's reduction during the backward (non-blocking)",
       .resume = {"overlap"},
       .metric = {"overlap"},
       .excludes = {"--deterministic"}},
      {.name = "--zero",
       .field = &AppConfig::zero,
       .help = "ZeRO over the ranks: 1 shards the optimizer state, 2 also the reduced gradients "
               "(0: every rank updates the whole model)",
       .check = range(0, 2),
       .resume = {"zero", Rule::Note},
       .metric = {"zero"},
       .excludes = {"--overlap"}},
      {.name = "--tensor-parallel",
       .field = &AppConfig::tensor_parallel,
       .help = "tensor-parallel shards per replica: the ranks are data-parallel replicas x "
               "shards, and each pair of Linear layers is split over the shards as Megatron "
               "splits them (1: off)",
       .check = range(1, 64),
       .resume = {"tensor_parallel", Rule::Note},
       .metric = {"tensor_parallel"},
       .excludes = {"--zero", "--accumulate", "--overlap", "--clip-grad-norm"}},
      {.name = "--pipeline-stages",
       .field = &AppConfig::pipeline_stages,
       .help = "pipeline parallelism: cut the model into P stages, one rank each (mpirun -np P); "
               "the cut balances the stages' profiled time (see --stage-balance)",
       .check = range(1, 64),
       .resume = {"pipeline_stages", Rule::Note},
       .metric = {"pipeline_stages"},
       .excludes = {"--zero", "--overlap", "--accumulate", "--thread-mode", "--clip-grad-norm",
                    "--sync-bn", "--tensor-parallel"}},
      {.name = "--micro-batches",
       .field = &AppConfig::micro_batches,
       .help = "with --pipeline-stages: micro-batches per batch (with --deterministic each one a "
               "micro-shard of --batch-size / M samples; 0: one per stage)",
       .check = range<std::int64_t>(0, 1024),
       .resume = {"micro_batches", Rule::Note},
       .metric = {"micro_batches"},
       .needs = {"--pipeline-stages"}},
      {.name = "--schedule",
       .field = &AppConfig::schedule,
       .help = "with --pipeline-stages: the order of each stage's forwards and backwards",
       .check = one_of({"gpipe", "1f1b"}),
       .resume = {"pipeline_schedule", Rule::Note},
       .metric = {"pipeline_schedule"},
       .needs = {"--pipeline-stages"}},
      {.name = "--stage-boundaries",
       .field = &AppConfig::stage_boundaries,
       .help = "with --pipeline-stages P: where stages end, P - 1 comma-separated names of the "
               "model's children (e.g. act1) or nodes; default: cut balancing --stage-balance",
       .resume = {"stage_boundaries", Rule::Note},
       .metric = {"stage_boundaries"},
       .needs = {"--pipeline-stages"}},
      {.name = "--stage-balance",
       .field = &AppConfig::stage_balance,
       .help = "with --pipeline-stages and no --stage-boundaries: what the cut balances: time "
               "(each node's, profiled in a few one-process steps on a micro-batch), flops (the "
               "forward's) or params; each falls back to the next when it counts nothing",
       .check = one_of({"time", "flops", "params"}),
       .resume = {"stage_balance", Rule::Note},
       .metric = {"stage_balance"},
       .needs = {"--pipeline-stages"}},
      {.name = "--dump-schedule",
       .field = &AppConfig::dump_schedule,
       .help = "write every pipeline stage's list of actions to FILE",
       .needs = {"--pipeline-stages"}},
      {.name = "--sync-bn",
       .field = &AppConfig::sync_bn,
       .help = "normalise with the statistics of the whole global batch, summed over thread "
               "replicas and ranks (as PyTorch's SyncBatchNorm), not each replica's own share",
       .resume = {"sync_bn"},
       .metric = {"sync_bn"}},
      {.name = "--no-fuse",
       .field = &AppConfig::no_fuse,
       .help = "do not fold bias_add and relu into matmul/conv2d, relu into BatchNorm and "
               "residual sums (and its backward into theirs), a residual sum into the BatchNorm "
               "before it, BatchNorm's backward into one data pass, a convolution's bias "
               "gradient into its weight gradient, nor SGD updates into their gradient products",
       .resume = {"fuse", Rule::Note, "fusion (--no-fuse)",
                  [](C c, F) { return fmt::format("{}", !c.no_fuse); }},
       .metric = {"fuse", [](C c, F) { return Json(!c.no_fuse); }}},
      {.name = "--upscale",
       .field = &AppConfig::upscale,
       .help = "enlarge every image K times per side (more work per sample)",
       .check = range(1, 16),
       .resume = {"upscale", Rule::SameMidEpoch},
       .metric = {"upscale"}},
      {.name = "--augment",
       .field = &AppConfig::augment,
       .help = "random transforms of the training images, drawn per sample from (seed, epoch, "
               "sample): crop (a shift by -4..4 pixels, zeros shifted in: a crop of the image "
               "padded by 4) and/or flip (horizontal, with probability 1/2)",
       .check = augmentations(),
       .resume = {"augment",
                  Rule::Note,
                  {},
                  [](C c, F) { return train::Augment::parse(c.augment).describe(); }},
       .metric = {"augment",
                  [](C c, F) { return Json(train::Augment::parse(c.augment).describe()); }}},
      {.name = "--no-prefetch",
       .field = &AppConfig::no_prefetch,
       .help = "prepare each training batch (gather, augmentation) on the main thread right "
               "before its step, not on a thread of its own during the step before (the same "
               "results); a process whose compute threads use every CPU it may run on (--threads 2 "
               "on 2 cores, an mpirun rank bound to a core) always does",
       .metric = {"prefetch", [](C c, F) { return Json(c.prefetch()); }}},
      {.name = "--profile",
       .field = &AppConfig::profile,
       .help = "time every kernel: per-epoch compute/communication/waiting/data split and a "
               "per-node table at the end (the steps after the first; the first's time apart)"},
      {.name = "--check-numerics",
       .field = &AppConfig::check_numerics,
       .help = "check every node's output for NaN and Inf and name the first node that produced "
               "one (the loss is checked every step regardless)"},
      {.name = "--collective-timeout",
       .field = &AppConfig::collective_timeout,
       .help = "seconds a collective may wait for the other ranks before the job ends with an "
               "error naming it and the ranks that did not arrive (0: no limit)",
       .check = range(0.0, 1e6)},
      {.name = "--trace",
       .field = &AppConfig::trace,
       .help = "write every kernel call of the training steps to FILE.json (Chrome trace: "
               "Perfetto, chrome://tracing), one track per rank and thread"},
      {.name = "--compute-table",
       .field = &AppConfig::compute_table,
       .help = "a simulated run only (-DMINIDL_SIMGRID=ON): do not run the kernels, spend the "
               "time FILE gives each node instead (per-node times of --profile runs, made by "
               "scripts/simulate-cluster --compute profile); large buffers are shared by the "
               "simulated ranks",
       .metric = {"compute_table"}},
  };
}

/// Checks what the rows promise each other, once: a mistake here is the program's.
void check_table(const std::vector<Flag>& table) {
  std::set<std::string_view> names, settings, metrics;
  for (const Flag& f : table) {
    if (f.is_flag()) {
      MINIDL_ASSERT(f.name.starts_with("--") && names.insert(f.name).second,
                    "flag table: bad or repeated flag name '", f.name, "'");
      MINIDL_ASSERT(f.field.add != nullptr, "flag table: ", f.name, " sets no AppConfig field");
    } else {
      MINIDL_ASSERT(
          (f.resume.key.empty() || f.resume.value) && (f.metric.key.empty() || f.metric.value),
          "flag table: the fact '", f.help, "' has no value");
    }
    if (!f.resume.key.empty() && !f.resume.part) {
      MINIDL_ASSERT(settings.insert(f.resume.key).second, "flag table: checkpoint key '",
                    f.resume.key, "' recorded twice");
    }
    if (!f.metric.key.empty()) {
      MINIDL_ASSERT(metrics.insert(f.metric.key).second, "flag table: metrics key '", f.metric.key,
                    "' recorded twice");
    }
  }
  for (const Flag& f : table) {
    for (const auto* list : {&f.needs, &f.excludes}) {
      for (std::string_view other : *list)
        MINIDL_ASSERT(names.contains(other), "flag table: ", f.name, " refers to no flag ", other);
    }
    if (!f.resume.part) continue;
    // The shared setting's notes and errors must name every flag that shapes it.
    const auto owner = std::find_if(table.begin(), table.end(), [&](const Flag& o) {
      return !o.resume.part && o.resume.key == f.resume.key;
    });
    MINIDL_ASSERT(owner != table.end(), "flag table: ", f.name, " is part of checkpoint key '",
                  f.resume.key, "', which no row records");
    MINIDL_ASSERT(owner->resume.what.find(f.name) != std::string_view::npos, "flag table: ", f.name,
                  " is part of '", f.resume.key, "', but its description '", owner->resume.what,
                  "' does not name it");
  }
}

const std::vector<Flag>& table() {
  static const std::vector<Flag> rows = [] {
    std::vector<Flag> t = make_table();
    check_table(t);
    return t;
  }();
  return rows;
}

const Flag& owner_of(const Resume& r) {
  for (const Flag& f : table())
    if (!f.resume.part && f.resume.key == r.key) return f;
  MINIDL_ASSERT(false, "no owner of checkpoint key '", r.key, "'");
  std::abort();
}

/// Text for a Markdown table cell: no '|' to end it early, no '<' to open an HTML tag.
std::string cell(std::string_view s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') {
      out += "\\|";
    } else if (ch == '<') {
      out += "&lt;";
    } else if (ch == '>') {
      out += "&gt;";
    } else {
      out += ch;
    }
  }
  return out;
}

/// Whether --help and the reference state the flag's default: not for a switch (off), an empty
/// text, or a value the flag itself refuses (--checkpoint-every's 0: not given).
bool shows_default(const Flag& f, const AppConfig& c) {
  if (f.field.is_switch()) return false;
  std::string value = f.field.text(c);
  if (value.empty()) return false;
  return !f.check.validator || f.check.validator(c)(value).empty();
}

/// The "on --resume" cell: the checkpoint key and what a resumed run must repeat.
std::string resume_words(const Resume& r) {
  if (r.key.empty()) return "";
  const Rule rule = r.part ? owner_of(r).resume.rule : r.rule;
  const std::string what = rule == Rule::Same           ? "must match"
                           : rule == Rule::SameMidEpoch ? "must match mid-epoch"
                                                        : "noted";
  return fmt::format("{} ({}`{}`)", what, r.part ? "in " : "", r.key);
}

}  // namespace

void add_flags(CLI::App& app, AppConfig& config) {
  std::map<std::string_view, CLI::Option*> added;
  for (const Flag& f : table()) {
    if (!f.is_flag() || !f.offered_by(config)) continue;
    CLI::Option* o = f.field.add(app, std::string(f.name), std::string(f.help), config);
    if (f.check.validator) o->check(f.check.validator(config));
    if (shows_default(f, config)) o->capture_default_str();
    added[f.name] = o;
  }
  for (const Flag& f : table()) {
    const auto self = added.find(f.name);
    if (self == added.end()) continue;
    for (std::string_view other : f.needs) {
      const auto it = added.find(other);
      MINIDL_ASSERT(it != added.end(), f.name, " needs ", other, ", which is not offered");
      self->second->needs(it->second);
    }
    for (std::string_view other : f.excludes) {
      const auto it = added.find(other);
      if (it != added.end()) self->second->excludes(it->second);
    }
  }
}

std::vector<checkpoint::Setting> checkpoint_settings(const AppConfig& config, const RunFacts& run) {
  std::vector<checkpoint::Setting> settings;
  for (const Flag& f : table()) {
    const Resume& r = f.resume;
    if (r.key.empty() || r.part) continue;
    settings.push_back({std::string(r.key), r.value ? r.value(config, run) : f.field.text(config),
                        r.rule, std::string(r.what.empty() ? f.name : r.what)});
  }
  return settings;
}

std::string metrics_config(const AppConfig& config, const RunFacts& run) {
  Json record = Json::object();
  for (const Flag& f : table()) {
    if (f.metric.key.empty()) continue;
    record[std::string(f.metric.key)] =
        f.metric.value ? f.metric.value(config, run) : f.field.json(config);
  }
  return record.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ranks_must_agree(const AppConfig& config, const std::vector<AppFlag>& own) {
  std::string s;
  for (const Flag& f : table())
    if (f.is_flag() && !f.per_rank) s += fmt::format("{} {}\n", f.name, f.field.text(config));
  for (const AppFlag& f : own) s += fmt::format("{} {}\n", f.name, *f.value);
  return s;
}

std::string flags_markdown(const AppConfig& config, const std::vector<AppFlag>& own) {
  std::string md =
      "| flag | default | allowed values | on `--resume` | metrics key | what it does |\n"
      "|---|---|---|---|---|---|\n";
  for (const Flag& f : table()) {
    if (!f.is_flag()) continue;
    std::string default_cell;
    if (!f.offered_by(config)) {
      default_cell = "not offered";
    } else if (f.field.is_switch()) {
      default_cell = f.field.text(config) == "true" ? "on" : "off";
    } else if (shows_default(f, config)) {
      default_cell = "`" + f.field.text(config) + "`";
    }
    std::string help(f.help);
    for (std::string_view n : f.needs) help += fmt::format("; needs `{}`", n);
    for (std::string_view n : f.excludes) help += fmt::format("; not with `{}`", n);
    if (!f.offered.when.empty()) help += fmt::format("; offered only {}", f.offered.when);
    md += fmt::format("| `{}` | {} | {} | {} | {} | {} |\n", f.name, cell(default_cell),
                      cell(f.check.words ? f.check.words(config) : std::string(f.field.kind)),
                      resume_words(f.resume),
                      f.metric.key.empty() ? "" : fmt::format("`{}`", f.metric.key), cell(help));
  }
  for (const AppFlag& f : own) {
    md += fmt::format("| `{}` | {} | text |  |  | {}; the example's own (AppHooks) |\n", f.name,
                      f.value->empty() ? "" : cell("`" + *f.value + "`"), cell(f.help));
  }
  md +=
      "\nRecorded without a flag:\n\n"
      "| setting | on `--resume` | metrics key |\n"
      "|---|---|---|\n";
  for (const Flag& f : table()) {
    if (f.is_flag()) continue;
    md += fmt::format("| {} | {} | {} |\n", cell(f.help), resume_words(f.resume),
                      f.metric.key.empty() ? "" : fmt::format("`{}`", f.metric.key));
  }
  return md;
}

}  // namespace minidl
