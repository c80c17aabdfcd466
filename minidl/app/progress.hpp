// Rank 0's training progress display: on a terminal, a bar redrawn in place ("\r") at most ten
// times a second with the epoch, its progress, samples/s, the running loss and the time left;
// when stdout is a file or a pipe, nothing but the program's own per-epoch lines; with --quiet,
// nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace minidl {

enum class ProgressMode {
  Quiet,  // no progress output
  Lines,  // no bar: the per-epoch lines only
  Live,   // a live bar on a terminal, besides the per-epoch lines
};

/// Quiet when quiet; Live when out is a terminal and the process was not started by mpirun (whose
/// ranks always see a terminal); else Lines. MINIDL_PROGRESS=live|lines overrides the choice.
ProgressMode progress_mode(std::FILE* out, bool quiet);

/// What one drawing of the bar shows.
struct ProgressState {
  int epoch = 0, epochs = 0;
  std::int64_t done = 0, epoch_size = 0;  // samples of the epoch
  double samples_per_second = 0.0;
  double loss = 0.0;          // running loss of the epoch
  double eta_seconds = -1.0;  // time left for all epochs; < 0: not known yet
};

/// The bar as one line of at most width - 1 columns (no "\r"), e.g.
/// "epoch  2/20 [#######-------]  52%  15234 samples/s  loss 0.2871  ETA 1:23".
std::string format_progress(const ProgressState& s, int width);

/// h:mm:ss or m:ss: "1:05:03", "2:07", "0:09".
std::string format_duration(double seconds);

class Progress {
 public:
  explicit Progress(ProgressMode mode, int epochs, std::FILE* out = stdout);
  ProgressMode mode() const { return mode_; }
  /// An epoch starts (or resumes, done samples in).
  void start_epoch(int epoch, std::int64_t epoch_size, std::int64_t done = 0);
  /// After a step, done samples into the epoch: redraws the bar when Live and a tenth of a
  /// second has passed since the last drawing. The loss is the one the trainer already read
  /// back, so a step costs no extra synchronisation.
  void update(std::int64_t done, double running_loss);
  /// Erases the bar, before other output; the next update draws it again.
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  ProgressMode mode_;
  int epochs_;
  std::FILE* out_;
  bool drawn_ = false;
  Clock::time_point last_draw_{};
  // Rates: samples/s over this epoch's steps; the time left from all steps and evaluations
  // since the first epoch began in this process.
  Clock::time_point run_start_{}, epoch_start_{};
  bool started_ = false;
  std::int64_t run_samples_ = 0;       // trained in this process before this epoch
  std::int64_t epoch_first_ = 0;       // the epoch's samples done when it (re)started
  std::int64_t remaining_epochs_ = 0;  // after this one
  ProgressState state_;
};

}  // namespace minidl
