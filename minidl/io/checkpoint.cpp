#include "minidl/io/checkpoint.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <system_error>
#include <tuple>

#include "minidl/core/error.hpp"
#include "minidl/core/text.hpp"
#include "minidl/io/safetensors.hpp"

namespace minidl::checkpoint {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kVersionKey = "minidl.checkpoint";
// The position's keys; settings may not use them.
constexpr std::string_view kPositionKeys[] = {"epoch",         "epoch_step",       "position",
                                              "step",          "epoch_samples",    "epoch_loss_sum",
                                              "epoch_correct", "minidl.checkpoint"};

const std::regex& name_pattern() {
  static const std::regex re(R"(ckpt-e(\d+)-s(\d+)\.safetensors)");
  return re;
}

/// A double as text that reads back to the same bits ("%a": hexadecimal).
std::string exact(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

/// "F32 [16,64]": the dtype spelled as in the file.
std::string describe(const Tensor& t) {
  return fmt::format("{} {}", dtype_safetensors_name(t.dtype()), t.shape());
}

struct Reader {
  const std::string& path;
  const Metadata& m;

  const std::string& text(std::string_view key) const {
    auto it = m.find(std::string(key));
    MINIDL_CHECK(it != m.end(), "checkpoint '", path, "': metadata '", key,
                 "' is missing; the file is damaged or not written by minidl");
    return it->second;
  }
  std::int64_t integer(std::string_view key) const {
    const std::string& s = text(key);
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    MINIDL_CHECK(!s.empty() && end == s.c_str() + s.size() && errno == 0 && v >= 0, "checkpoint '",
                 path, "': metadata '", key, "' is '", s, "', expected a non-negative integer");
    return v;
  }
  double real(std::string_view key) const {
    const std::string& s = text(key);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    MINIDL_CHECK(!s.empty() && end == s.c_str() + s.size(), "checkpoint '", path, "': metadata '",
                 key, "' is '", s, "', expected a number");
    return v;
  }
};

}  // namespace

Position position_from_metadata(const std::string& path, const Metadata& m) {
  const Reader r{path, m};
  const std::string& version = r.text(kVersionKey);
  MINIDL_CHECK(version == kVersion, "checkpoint '", path, "': format version '", version,
               "', this program reads version ", kVersion);
  Position p;
  const std::int64_t epochs = r.integer("epoch");
  MINIDL_CHECK(epochs < 1'000'000'000, "checkpoint '", path, "': metadata 'epoch' is ", epochs,
               ", too large");
  p.epoch = static_cast<int>(epochs) + 1;
  p.epoch_step = r.integer("epoch_step");
  p.next_sample = r.integer("position");
  p.step = r.integer("step");
  p.samples = r.integer("epoch_samples");
  p.loss_sum = r.real("epoch_loss_sum");
  p.correct = r.real("epoch_correct");
  MINIDL_CHECK(p.samples == p.next_sample && p.step >= p.epoch_step, "checkpoint '", path,
               "': inconsistent position: ", p.epoch_step, " steps and ", p.next_sample,
               " samples into epoch ", p.epoch, ", ", p.samples, " samples counted, ", p.step,
               " steps in all");
  return p;
}

std::string file_name(int epochs, std::int64_t steps) {
  return fmt::format("ckpt-e{:04}-s{:06}.safetensors", epochs, steps);
}

namespace {

/// The checkpoints in dir as (epochs, steps, path), oldest first.
std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> scan(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  MINIDL_CHECK(!ec, "cannot list checkpoint directory '", dir, "': ", ec.message());
  std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> found;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, name_pattern()) || !e.is_regular_file(ec)) continue;
    // Compared as numbers: the names sort as text only while the counts fit their widths.
    std::int64_t epochs = 0, steps = 0;
    for (auto [text, value] : {std::pair(m[1].str(), &epochs), std::pair(m[2].str(), &steps)}) {
      const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), *value);
      MINIDL_CHECK(err == std::errc() && end == text.data() + text.size(), "checkpoint directory '",
                   dir, "': the counts in the name of '", printable(name),
                   "' are too large (at most ", INT64_MAX, "); remove or rename it");
    }
    found.emplace_back(epochs, steps, e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::vector<std::string> list(const std::string& dir) {
  std::vector<std::string> paths;
  for (auto& [e, s, p] : scan(dir)) paths.push_back(std::move(p));
  return paths;
}

std::vector<std::string> list_after(const std::string& dir, int epochs, std::int64_t steps) {
  std::vector<std::string> paths;
  for (auto& [e, s, p] : scan(dir))
    if (std::pair(e, s) > std::pair<std::int64_t, std::int64_t>(epochs, steps))
      paths.push_back(std::move(p));
  return paths;
}

std::string resolve(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;  // load_safetensors says what is wrong
  const std::vector<std::string> all = list(path);
  MINIDL_CHECK(!all.empty(), "--resume: directory '", path,
               "' holds no checkpoint (files named ckpt-eNNNN-sNNNNNN.safetensors)");
  return all.back();
}

Metadata settings_metadata(const std::vector<Setting>& settings) {
  Metadata m;
  for (const Setting& s : settings) {
    MINIDL_ASSERT(std::find(std::begin(kPositionKeys), std::end(kPositionKeys), s.key) ==
                      std::end(kPositionKeys),
                  "setting '", s.key, "' uses a checkpoint position key");
    m[s.key] = s.value;
  }
  return m;
}

std::string save(const std::string& dir, const Position& pos, const Tensors& tensors,
                 const Metadata& settings, int keep) {
  MINIDL_CHECK(keep >= 1, "checkpoints to keep must be at least 1, got ", keep);
  const int epochs = pos.epoch - 1;
  const std::string path = (fs::path(dir) / file_name(epochs, pos.epoch_step)).string();
  Metadata m = settings;
  m["format"] = "pt";  // PyTorch's loaders want it; the tensors use PyTorch's names and layouts
  m["framework"] = "minidl";
  m[std::string(kVersionKey)] = kVersion;
  m["epoch"] = std::to_string(epochs);
  m["epoch_step"] = std::to_string(pos.epoch_step);
  m["position"] = std::to_string(pos.next_sample);
  m["step"] = std::to_string(pos.step);
  m["epoch_samples"] = std::to_string(pos.samples);
  m["epoch_loss_sum"] = exact(pos.loss_sum);
  m["epoch_correct"] = exact(pos.correct);
  NamedTensors all = tensors.parameters;
  all.insert(all.end(), tensors.buffers.begin(), tensors.buffers.end());
  for (const auto& [name, t] : tensors.optimizer_state)
    all.emplace_back(std::string(kOptimizerPrefix) + name, t);
  save_safetensors(path, all, m);

  // Only now that the new one is in place: drop the oldest, and what killed writers left.
  std::vector<std::string> old = list(dir);
  std::error_code ec;
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < old.size(); ++i) {
    if (old[i] != path) fs::remove(old[i], ec);
  }
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    // "<checkpoint>.tmp.XXXXXX" (write_file_atomically's), or "<checkpoint>.tmp" of older ones.
    const std::size_t tmp = name.rfind(".tmp");
    const std::size_t tail = tmp == std::string::npos ? 0 : name.size() - tmp;
    if (tmp != std::string::npos && (tail == 4 || (tail == 11 && name[tmp + 4] == '.')) &&
        std::regex_match(name.substr(0, tmp), name_pattern())) {
      fs::remove(e.path(), ec);
    }
  }
  return path;
}

Loaded load(const std::string& path, const Tensors& into) {
  SafetensorsFile file = load_safetensors(path);
  MINIDL_CHECK(file.metadata.count(std::string(kVersionKey)) != 0, "'", path,
               "' is not a minidl checkpoint: its metadata has no '", kVersionKey,
               "' entry (a file written by --save holds the parameters only: start from it "
               "with --init)");
  Loaded out;
  out.path = path;
  out.position = position_from_metadata(path, file.metadata);
  out.metadata = std::move(file.metadata);

  struct Expected {
    std::string name;
    Tensor t;
    const char* what;
  };
  std::vector<Expected> expected;
  for (const auto& [name, t] : into.parameters)
    expected.push_back({name, t, "a parameter of the model"});
  for (const auto& [name, t] : into.buffers) expected.push_back({name, t, "a buffer of the model"});
  for (const auto& [name, t] : into.optimizer_state) {
    expected.push_back({std::string(kOptimizerPrefix) + name, t, "optimizer state"});
  }
  auto find = [&](const std::string& name) {
    return std::find_if(file.tensors.begin(), file.tensors.end(),
                        [&](const auto& f) { return f.first == name; });
  };
  std::vector<std::string> problems;
  for (const Expected& e : expected) {
    auto it = find(e.name);
    if (it == file.tensors.end()) {
      problems.push_back(
          fmt::format("tensor '{}' is missing (expected {}, {})", e.name, describe(e.t), e.what));
    } else if (it->second.shape() != e.t.shape() || it->second.dtype() != e.t.dtype()) {
      problems.push_back(fmt::format("tensor '{}': expected {}, found {}", e.name, describe(e.t),
                                     describe(it->second)));
    }
  }
  for (const auto& [name, t] : file.tensors) {
    // Compared through a plain reference: clang before 16 cannot capture a structured binding.
    const std::string& tensor_name = name;
    const bool known = std::any_of(expected.begin(), expected.end(),
                                   [&](const Expected& e) { return e.name == tensor_name; });
    if (known) continue;
    const bool state = name.starts_with(kOptimizerPrefix);
    problems.push_back(fmt::format("unexpected tensor '{}' {} ({})", name, describe(t),
                                   state ? "this optimizer keeps no such state"
                                         : "the model has no such parameter or buffer"));
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += (list.empty() ? "" : "; ") + p;
    MINIDL_FAIL("checkpoint '", path, "' does not match this model and optimizer: ", list);
  }
  for (const Expected& e : expected) {
    Tensor dst = e.t;
    dst.copy_from(find(e.name)->second);
  }
  return out;
}

std::vector<std::string> check_settings(const Loaded& ckpt, const std::vector<Setting>& settings) {
  const Position& p = ckpt.position;
  const bool mid_epoch = p.epoch_step > 0;
  std::vector<std::string> refused, notes;
  bool only_mid_epoch = true;  // every refusal would be a note at an epoch boundary
  for (const Setting& s : settings) {
    auto it = ckpt.metadata.find(s.key);
    if (it == ckpt.metadata.end() || it->second == s.value) continue;
    const std::string diff =
        fmt::format("{} is {} in the checkpoint, {} here", s.flag, it->second, s.value);
    if (s.rule == Rule::Same || (s.rule == Rule::SameMidEpoch && mid_epoch)) {
      refused.push_back(diff);
      only_mid_epoch = only_mid_epoch && s.rule == Rule::SameMidEpoch;
    } else if (s.rule == Rule::SameMidEpoch) {
      notes.push_back(diff + " (the checkpoint is at an epoch boundary: the next epochs use " +
                      s.value + ")");
    } else {
      notes.push_back(diff + " (training goes on with " + s.value +
                      ", so the result is not bit for bit what the saved run would reach)");
    }
  }
  if (!refused.empty()) {
    std::string list;
    for (const std::string& r : refused) list += (list.empty() ? "" : "; ") + r;
    MINIDL_FAIL("checkpoint '", ckpt.path, "' ",
                mid_epoch ? fmt::format("(taken {} steps into epoch {}) ", p.epoch_step, p.epoch)
                          : std::string(),
                "does not fit this run: ", list,
                only_mid_epoch ? "; resume with the checkpoint's values, or from a checkpoint "
                                 "taken at an epoch boundary"
                               : "; resume with the checkpoint's values");
  }
  return notes;
}

}  // namespace minidl::checkpoint
