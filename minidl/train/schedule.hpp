// Learning-rate schedules: the rate of optimizer step t (counted from 0 over the whole run) as a
// pure function of t, fed to the graph's learning-rate input every step (no recompiling):
//   lr(t) = base * warm(t) * decay(t),  warm(t) = min(1, (t + 1) / warmup)  (1 without warm-up)
//   constant: decay = 1
//   step:     decay = gamma ^ floor(t / (step_epochs * steps_per_epoch))
//   cosine:   decay = (1 + cos(pi * min(1, max(0, t - warmup) / max(1, total - warmup)))) / 2
// computed in double, as PyTorch's LambdaLR with the same lambda computes it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace minidl::optim {

enum class ScheduleKind { Constant, Step, Cosine };
/// "constant", "step", "cosine"; anything else fails naming the allowed values.
ScheduleKind parse_schedule(std::string_view name);
std::vector<std::string> schedule_names();

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::Constant;
  std::int64_t step_epochs = 1;  // step: decay every this many epochs
  double gamma = 0.1;            // step: the factor
  std::int64_t warmup_steps = 0;
};

class LrSchedule {
 public:
  /// steps_per_epoch: optimizer steps in one epoch; total_steps: in the whole run (cosine).
  LrSchedule(double base, ScheduleOptions options, std::int64_t steps_per_epoch,
             std::int64_t total_steps);
  double lr(std::int64_t step) const;
  std::string describe() const;

 private:
  double base_;
  ScheduleOptions options_;
  std::int64_t steps_per_epoch_, total_steps_;
};

}  // namespace minidl::optim
