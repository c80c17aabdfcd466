// The flag table (app/flags.hpp): parsing with the example's defaults and per-example flags,
// the checkpoint settings (whose keys old checkpoints carry), the metrics' config record and
// the Markdown reference all come from its rows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "minidl/app/flags.hpp"
#include "minidl/core/threading.hpp"

namespace minidl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Rule = checkpoint::Rule;

RunFacts facts() {
  return {.program = "prog",
          .model = "MLP",
          .parameters = 610,
          .train_samples = 100,
          .test_samples = 20,
          .ranks = 2,
          .threads = 3,
          .optimizer = "SGD()",
          .schedule = "constant 0.01"};
}

/// Parses the command line over config with the table's flags; the error's message, or "".
std::string parse(AppConfig& config, const std::string& command_line) {
  CLI::App app("test", "prog");
  add_flags(app, config);
  try {
    app.parse(command_line);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(Flags, ParsesOverTheExampleDefaults) {
  AppConfig c;
  c.epochs = 5;  // an example's own default
  EXPECT_EQ(parse(c, "--batch-size 16 --accumulate 4 --no-shuffle --lr 0.5"), "");
  EXPECT_EQ(c.epochs, 5);
  EXPECT_EQ(c.batch_size, 16);
  EXPECT_EQ(c.accumulate, 4);
  EXPECT_TRUE(c.no_shuffle);
  EXPECT_EQ(c.lr, 0.5);
}

TEST(Flags, RefusesValuesOutsideTheRowsCheck) {
  AppConfig c;
  EXPECT_THAT(parse(c, "--accumulate 0"), HasSubstr("--accumulate"));
  EXPECT_THAT(parse(c, "--activation gelu"), HasSubstr("--activation"));
  EXPECT_THAT(parse(c, "--dataset cifar10"), HasSubstr("--dataset"));  // not one of c.datasets
  EXPECT_EQ(parse(c, "--micro-batch 4"), "--micro-batch requires --deterministic");
  EXPECT_EQ(parse(c, "--init a --resume b"), "--init excludes --resume");
  EXPECT_EQ(parse(c, "--augment rotate"),
            "--augment: augmentation 'rotate' is not one of none (or empty), crop, flip, "
            "crop,flip");
}

TEST(Flags, AugmentIsRecordedInItsCanonicalForm) {
  for (const auto& [given, recorded] : {std::pair{"crop,flip", "crop,flip"},
                                        std::pair{"flip", "flip"}, std::pair{"none", "none"}}) {
    AppConfig c;
    ASSERT_EQ(parse(c, std::string("--augment ") + given + " --no-prefetch"), "") << given;
    std::map<std::string, checkpoint::Setting> settings;
    for (const checkpoint::Setting& s : checkpoint_settings(c, facts())) settings[s.key] = s;
    EXPECT_EQ(settings["augment"].value, recorded);
    EXPECT_EQ(settings["augment"].rule, Rule::Note);  // the position stays valid
    EXPECT_FALSE(settings.contains("prefetch"));      // the same bits either way
    const nlohmann::json m = nlohmann::json::parse(metrics_config(c, facts()));
    EXPECT_EQ(m["augment"], recorded);
    EXPECT_EQ(m["prefetch"], false);
  }
  AppConfig empty;  // --augment ""
  empty.augment = "";
  EXPECT_EQ(nlohmann::json::parse(metrics_config(empty, facts()))["augment"], "none");
}

TEST(Flags, OffersPerExampleFlagsWhereTheExampleAllowsThem) {
  AppConfig one_loss;  // cross-entropy only: no --loss, but --label-smoothing
  EXPECT_THAT(parse(one_loss, "--loss mse"), HasSubstr("not expected"));
  EXPECT_EQ(parse(one_loss, "--label-smoothing 0.1"), "");

  AppConfig mse;
  mse.loss = "mse";
  mse.losses = {"mse"};
  EXPECT_THAT(parse(mse, "--label-smoothing 0.1"), HasSubstr("not expected"));

  AppConfig two;
  two.losses = {"cross-entropy", "mse"};
  EXPECT_EQ(parse(two, "--loss mse"), "");
  EXPECT_EQ(two.loss, "mse");
  EXPECT_THAT(parse(two, "--loss bce"), HasSubstr("--loss"));
}

// The keys, values, rules and descriptions that checkpoints already carry: an older checkpoint
// resumes only while these stay (a key it lacks, of a newer flag, is not checked). New rows may
// add keys.
TEST(Flags, CheckpointSettingsKeepTheirKeys) {
  using Want = std::tuple<std::string, Rule, std::string>;  // value, rule, what
  const std::map<std::string, Want> want = {
      {"model", {"MLP", Rule::Same, "the model"}},
      {"dataset", {"mnist", Rule::SameMidEpoch, "--dataset"}},
      {"train_samples", {"100", Rule::SameMidEpoch, "the training set size (--train-limit)"}},
      {"upscale", {"1", Rule::SameMidEpoch, "--upscale"}},
      {"batch_size", {"64", Rule::SameMidEpoch, "--batch-size"}},
      {"accumulate", {"1", Rule::SameMidEpoch, "--accumulate"}},
      {"seed", {"42", Rule::SameMidEpoch, "--seed"}},
      {"shuffle", {"true", Rule::SameMidEpoch, "shuffling (--no-shuffle)"}},
      {"lr", {"0.01", Rule::Note, "--lr"}},
      {"optimizer", {"sgd", Rule::Same, "--optimizer"}},
      {"momentum", {"0", Rule::Note, "--momentum"}},
      {"nesterov", {"false", Rule::Note, "--nesterov"}},
      {"weight_decay", {"0", Rule::Note, "--weight-decay"}},
      {"betas", {"0.9,0.999", Rule::Note, "--beta1/--beta2"}},
      {"eps", {"1e-08", Rule::Note, "--eps"}},
      {"lr_schedule",
       {"constant step_epochs=1 gamma=0.1 warmup=0 epochs=20", Rule::Note,
        "--lr-schedule, --lr-step-epochs, --lr-gamma, --warmup-steps, --epochs"}},
      {"clip_grad_norm", {"0", Rule::Note, "--clip-grad-norm"}},
      {"loss", {"cross-entropy label_smoothing=0", Rule::Note, "--loss, --label-smoothing"}},
      {"ranks", {"2", Rule::Note, "the number of ranks"}},
      {"threads", {"3", Rule::Note, "the number of threads (--threads)"}},
      {"thread_mode", {"intra-op", Rule::Note, "--thread-mode"}},
      {"backend", {"native", Rule::Note, "--backend"}},
      {"reduce", {"allreduce", Rule::Note, "--reduce"}},
      {"bucket_mb", {"0.25", Rule::Note, "--bucket-mb"}},
      {"overlap", {"false", Rule::Note, "--overlap"}},
      {"fuse", {"true", Rule::Note, "fusion (--no-fuse)"}},
      {"deterministic", {"false", Rule::Note, "--deterministic"}},
      {"micro_batch", {"0", Rule::Note, "--micro-batch"}},
      {"augment", {"none", Rule::Note, "--augment"}},
  };
  std::map<std::string, Want> got;
  for (const checkpoint::Setting& s : checkpoint_settings(AppConfig{}, facts()))
    EXPECT_TRUE(got.emplace(s.key, Want{s.value, s.rule, s.flag}).second) << s.key;
  for (const auto& [key, w] : want) {
    ASSERT_TRUE(got.contains(key)) << key;
    EXPECT_EQ(got.at(key), w) << key;
  }
}

TEST(Flags, SharedSettingsFollowEveryFlagThatShapesThem) {
  AppConfig c;
  ASSERT_EQ(parse(c,
                  "--lr-gamma 0.5 --warmup-steps 7 --beta2 0.99 --label-smoothing 0.1 "
                  "--deterministic --micro-batch 4 --no-fuse"),
            "");
  std::map<std::string, std::string> got;
  for (const checkpoint::Setting& s : checkpoint_settings(c, facts())) got[s.key] = s.value;
  EXPECT_EQ(got["lr_schedule"], "constant step_epochs=1 gamma=0.5 warmup=7 epochs=20");
  EXPECT_EQ(got["betas"], "0.9,0.99");
  EXPECT_EQ(got["loss"], "cross-entropy label_smoothing=0.1");
  EXPECT_EQ(got["micro_batch"], "4");
  EXPECT_EQ(got["fuse"], "false");
}

TEST(Flags, PrefetchRule) {
  // A prefetch thread only where a CPU is left for it beside the OpenMP threads, and never with
  // --no-prefetch; the reason is what the profile prints.
  const int threads = max_threads();
  AppConfig c;
  set_num_threads(allowed_cpus());
  EXPECT_FALSE(c.prefetch());
  EXPECT_EQ(c.prefetch_off(), fmt::format("no CPU left for a prefetch thread: {} compute "
                                          "thread(s) on {} CPU(s)",
                                          allowed_cpus(), allowed_cpus()));
  if (allowed_cpus() > 1) {
    set_num_threads(allowed_cpus() - 1);
    EXPECT_TRUE(c.prefetch());
    EXPECT_EQ(c.prefetch_off(), "");
  }
  c.no_prefetch = true;
  EXPECT_FALSE(c.prefetch());
  EXPECT_EQ(c.prefetch_off(), "--no-prefetch");
  set_num_threads(threads);
}

TEST(Flags, MetricsConfigRecord) {
  RunFacts run = facts();
  run.resumed_from = "ck/ckpt-e0001-s000000.safetensors";
  run.first_epoch = 2;
  // The record as metrics files have it (scripts/plot-metrics labels runs by it); new rows may
  // add keys.
  const nlohmann::json got = nlohmann::json::parse(metrics_config(AppConfig{}, run));
  const nlohmann::json want = {{"program", "prog"},
                               {"model", "MLP"},
                               {"parameters", 610},
                               {"dataset", "mnist"},
                               {"train_samples", 100},
                               {"test_samples", 20},
                               {"normalize", false},
                               {"upscale", 1},
                               {"ranks", 2},
                               {"threads", 3},
                               {"thread_mode", "intra-op"},
                               {"deterministic", false},
                               {"micro_batch", 0},
                               {"backend", "native"},
                               {"reduce", "allreduce"},
                               {"bucket_mb", 0.25},
                               {"overlap", false},
                               {"fuse", true},
                               {"batch_size", 64},
                               {"accumulate", 1},
                               {"lr", 0.01},
                               {"optimizer", "SGD()"},
                               {"momentum", 0.0},
                               {"nesterov", false},
                               {"weight_decay", 0.0},
                               {"lr_schedule", "constant 0.01"},
                               {"clip_grad_norm", 0.0},
                               {"loss", "cross-entropy"},
                               {"label_smoothing", 0.0},
                               {"seed", 42},
                               {"shuffle", true},
                               {"epochs", 20},
                               {"augment", "none"},
                               // Whether a CPU is left for the thread here (Flags.PrefetchRule).
                               {"prefetch", AppConfig{}.prefetch()},
                               {"resume", "ck/ckpt-e0001-s000000.safetensors"},
                               {"first_epoch", 2}};
  for (const auto& [key, value] : want.items()) EXPECT_EQ(got[key], value) << key;

  AppConfig deterministic;
  deterministic.deterministic = true;
  const nlohmann::json d = nlohmann::json::parse(metrics_config(deterministic, facts()));
  EXPECT_EQ(d["thread_mode"], "deterministic");
  EXPECT_EQ(d["micro_batch"], 8);
  EXPECT_TRUE(d["resume"].is_null());
}

TEST(Flags, MarkdownShowsTheExampleDefaults) {
  AppConfig c;
  c.epochs = 5;
  const std::string md = flags_markdown(c);
  EXPECT_THAT(md, HasSubstr("| `--epochs` | `5` | integer 1 to 100000 | noted (in `lr_schedule`) "
                            "| `epochs` | epochs |\n"));
  EXPECT_THAT(md, HasSubstr("| `--accumulate` | `1` | integer 1 to 1048576 | must match "
                            "mid-epoch (`accumulate`) | `accumulate` | gradient accumulation"));
  EXPECT_THAT(md, HasSubstr("| `--loss` | not offered |"));
  EXPECT_THAT(md, HasSubstr("data/&lt;dataset&gt;"));  // no stray HTML tag
  EXPECT_THAT(md, Not(HasSubstr("--help-markdown")));

  std::string png = "out.png";
  const std::vector<AppFlag> own = {{"--png", "write a PNG to FILE", &png}};
  EXPECT_THAT(flags_markdown(c, own),
              HasSubstr("| `--png` | `out.png` | text |  |  | write a PNG to FILE; the example's "
                        "own (AppHooks) |\n"));
}

}  // namespace
}  // namespace minidl
