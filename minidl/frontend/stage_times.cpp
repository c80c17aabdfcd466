#include "minidl/frontend/stage_times.hpp"

#include <fmt/format.h>

#include "minidl/core/error.hpp"

namespace minidl {

StageTimes stage_times(std::span<const runtime::KernelProfile> profile) {
  StageTimes t;
  for (const runtime::KernelProfile& k : profile) {
    const ir::Node& n = *k.node;
    t.idle += k.idle_seconds;
    const double work = k.seconds - k.idle_seconds;
    if (n.def().comm_role() != ir::CommRole::None || n.phase() == ir::Phase::Communication)
      t.communication += work;
    else if (n.phase() == ir::Phase::Update)
      t.update += work;
    else if (n.phase() == ir::Phase::Backward)
      t.backward += work;
    else
      t.forward += work;
  }
  return t;
}

StageTimes stage_times(const std::vector<const runtime::Executable*>& executables) {
  StageTimes t;
  for (const runtime::Executable* exe : executables) t += stage_times(exe->profile());
  return t;
}

std::vector<StageTimes> gather_stage_times(parallel::Communicator& comm, const StageTimes& mine,
                                           int stages) {
  MINIDL_CHECK(stages >= 1 && comm.size() % stages == 0, "stage times: ", comm.size(),
               " ranks are not ", stages, " stages of equal size");
  constexpr int kFields = 5;
  const double row[kFields] = {mine.forward, mine.backward, mine.update, mine.communication,
                               mine.idle};
  std::vector<double> all(static_cast<std::size_t>(comm.size()) * kFields);
  comm.allgather(row, all.data(), sizeof(row));
  const int per_stage = comm.size() / stages;
  std::vector<StageTimes> out(static_cast<std::size_t>(stages));
  for (int r = 0; r < comm.size(); ++r) {
    const double* x = all.data() + static_cast<std::size_t>(r) * kFields;
    out[static_cast<std::size_t>(r / per_stage)] += StageTimes{
        x[0] / per_stage, x[1] / per_stage, x[2] / per_stage, x[3] / per_stage, x[4] / per_stage};
  }
  return out;
}

double ideal_bubble(int stages, int micro) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro + stages - 1);
}

std::string format_stage_times(const std::vector<StageTimes>& stages, std::int64_t steps, int micro,
                               const std::string& indent) {
  const int p = static_cast<int>(stages.size());
  std::string text = indent + "pipeline bubble (idle in receives / step time):";
  for (int s = 0; s < p; ++s)
    text +=
        fmt::format(" stage {} {:.1f}%", s, 100.0 * stages[static_cast<std::size_t>(s)].bubble());
  text += fmt::format(", ideal (P-1)/(M+P-1) = {:.1f}%\n", 100.0 * ideal_bubble(p, micro));
  const double per = steps > 0 ? 1e3 / static_cast<double>(steps) : 0.0;  // ms per step
  for (int s = 0; s < p; ++s) {
    const StageTimes& t = stages[static_cast<std::size_t>(s)];
    text += fmt::format(
        "{}  stage {} per step: forward {:.2f} ms  backward {:.2f} ms  update {:.2f} ms  "
        "communication {:.2f} ms  idle {:.2f} ms  (step {:.2f} ms)\n",
        indent, s, t.forward * per, t.backward * per, t.update * per, t.communication * per,
        t.idle * per, t.step() * per);
  }
  return text;
}

}  // namespace minidl
