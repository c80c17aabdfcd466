#include "minidl/app/progress.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace minidl {

namespace {

/// Columns of the terminal behind out; 80 when it does not say.
int terminal_width(std::FILE* out) {
  winsize ws{};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

}  // namespace

ProgressMode progress_mode(std::FILE* out, bool quiet) {
  if (quiet) return ProgressMode::Quiet;
  // mpirun hands its ranks a pseudo-terminal whatever its own output is, so under a launcher a
  // terminal says nothing: plain lines there, unless MINIDL_PROGRESS=live asks for the bar.
  const char* forced = std::getenv("MINIDL_PROGRESS");
  if (forced != nullptr && std::string_view(forced) == "live") return ProgressMode::Live;
  if (forced != nullptr && std::string_view(forced) == "lines") return ProgressMode::Lines;
  const bool launched =
      std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_RANK") != nullptr;
  return !launched && ::isatty(::fileno(out)) ? ProgressMode::Live : ProgressMode::Lines;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

std::string format_progress(const ProgressState& s, int width) {
  const double frac =
      s.epoch_size > 0
          ? std::clamp(static_cast<double>(s.done) / static_cast<double>(s.epoch_size), 0.0, 1.0)
          : 0.0;
  const int digits = static_cast<int>(fmt::format("{}", s.epochs).size());
  const std::string head = fmt::format("epoch {:>{}}/{} ", s.epoch, digits, s.epochs);
  const std::string tail = fmt::format(
      " {:3.0f}%  {:.0f} samples/s  loss {:.4f}  ETA {}", 100.0 * frac, s.samples_per_second,
      s.loss, s.eta_seconds < 0 ? std::string("?") : format_duration(s.eta_seconds));
  const int room = width - 1 - static_cast<int>(head.size() + tail.size()) - 2;
  std::string line = head;
  if (room >= 5) {
    const int bar = std::min(room, 30);
    const int full = static_cast<int>(std::floor(frac * bar));
    line += '[';
    line.append(static_cast<std::size_t>(full), '#');
    line.append(static_cast<std::size_t>(bar - full), '-');
    line += ']';
  }
  line += tail;
  if (static_cast<int>(line.size()) > width - 1) line.resize(std::max(width - 1, 0));
  return line;
}

Progress::Progress(ProgressMode mode, int epochs, std::FILE* out)
    : mode_(mode), epochs_(epochs), out_(out) {}

void Progress::start_epoch(int epoch, std::int64_t epoch_size, std::int64_t done) {
  const Clock::time_point now = Clock::now();
  if (!started_) {
    run_start_ = now;
    started_ = true;
  } else {
    run_samples_ += state_.done - epoch_first_;
  }
  epoch_start_ = now;
  epoch_first_ = done;
  remaining_epochs_ = std::max(epochs_ - epoch, 0);
  state_ = ProgressState{.epoch = epoch, .epochs = epochs_, .done = done, .epoch_size = epoch_size};
}

void Progress::update(std::int64_t done, double running_loss) {
  state_.done = done;
  state_.loss = running_loss;
  if (mode_ != ProgressMode::Live) return;
  const Clock::time_point now = Clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  const double epoch_s = std::chrono::duration<double>(now - epoch_start_).count();
  const double run_s = std::chrono::duration<double>(now - run_start_).count();
  const std::int64_t trained = run_samples_ + done - epoch_first_;
  state_.samples_per_second =
      epoch_s > 0 ? static_cast<double>(done - epoch_first_) / epoch_s : 0.0;
  const std::int64_t left = state_.epoch_size - done + remaining_epochs_ * state_.epoch_size;
  state_.eta_seconds = trained > 0 && run_s > 0
                           ? static_cast<double>(left) * run_s / static_cast<double>(trained)
                           : -1.0;
  const std::string line = format_progress(state_, terminal_width(out_));
  std::fprintf(out_, "\r%s\033[K", line.c_str());
  std::fflush(out_);
  drawn_ = true;
  last_draw_ = now;
}

void Progress::clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace minidl
