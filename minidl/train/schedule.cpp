#include "minidl/train/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "minidl/core/error.hpp"

namespace minidl::optim {

std::vector<std::string> schedule_names() { return {"constant", "step", "cosine"}; }

ScheduleKind parse_schedule(std::string_view name) {
  if (name == "constant") return ScheduleKind::Constant;
  if (name == "step") return ScheduleKind::Step;
  if (name == "cosine") return ScheduleKind::Cosine;
  MINIDL_FAIL("unknown learning-rate schedule '", name, "' (expected constant, step or cosine)");
}

LrSchedule::LrSchedule(double base, ScheduleOptions options, std::int64_t steps_per_epoch,
                       std::int64_t total_steps)
    : base_(base), options_(options), steps_per_epoch_(steps_per_epoch), total_steps_(total_steps) {
  MINIDL_CHECK(base > 0.0, "learning rate must be positive, got ", base);
  MINIDL_CHECK(options.step_epochs >= 1,
               "the step schedule's period must be at least 1 epoch, got ", options.step_epochs);
  MINIDL_CHECK(options.gamma > 0.0, "the step schedule's gamma must be positive, got ",
               options.gamma);
  MINIDL_CHECK(options.warmup_steps >= 0, "warm-up steps must be >= 0, got ", options.warmup_steps);
  MINIDL_CHECK(steps_per_epoch >= 1 && total_steps >= 1, "a schedule needs at least one step");
}

double LrSchedule::lr(std::int64_t t) const {
  const auto w = static_cast<double>(options_.warmup_steps);
  const double warm =
      options_.warmup_steps > 0 ? std::min(1.0, static_cast<double>(t + 1) / w) : 1.0;
  double decay = 1.0;
  switch (options_.kind) {
    case ScheduleKind::Constant:
      break;
    case ScheduleKind::Step:
      decay = std::pow(options_.gamma,
                       static_cast<double>(t / (options_.step_epochs * steps_per_epoch_)));
      break;
    case ScheduleKind::Cosine: {
      const double progress =
          std::min(1.0, std::max(0.0, static_cast<double>(t) - w) /
                            std::max(1.0, static_cast<double>(total_steps_) - w));
      decay = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      break;
    }
  }
  return base_ * warm * decay;
}

std::string LrSchedule::describe() const {
  std::string s;
  switch (options_.kind) {
    case ScheduleKind::Constant:
      s = fmt::format("constant {}", base_);
      break;
    case ScheduleKind::Step:
      s = fmt::format("{} x {} every {} epoch(s)", base_, options_.gamma, options_.step_epochs);
      break;
    case ScheduleKind::Cosine:
      s = fmt::format("cosine from {} over {} steps", base_, total_steps_);
      break;
  }
  if (options_.warmup_steps > 0) s += fmt::format(", {} warm-up steps", options_.warmup_steps);
  return s;
}

}  // namespace minidl::optim
