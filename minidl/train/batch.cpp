#include "minidl/train/batch.hpp"

#include <cstring>

namespace minidl::train {

namespace {

// Bytes of one row of t, the `what` [count, ...], checked against one sample of the step's input
// [n, ...].
std::size_t row_bytes(const Tensor& t, std::int64_t count, const char* what, const Tensor& input,
                      std::int64_t n) {
  MINIDL_CHECK(t.shape().rank() >= 1 && t.shape()[0] == count, "gather: the ", what, " ", t.shape(),
               " do not have the samples' ", count, " rows first");
  const std::int64_t per = t.numel() / count;
  MINIDL_CHECK(t.dtype() == input.dtype() && per * n == input.numel(), "gather: the step wants ",
               input.dtype(), " ", input.shape(), " for ", n, " samples (", input.numel() / n,
               " values each), but the ", what, " are ", t.dtype(), " ", t.shape(), " (", per,
               " values each)");
  return static_cast<std::size_t>(per) * dtype_size(t.dtype());
}

}  // namespace

void gather(CompiledStep& step, const Tensor& samples, const Tensor& targets,
            std::span<const std::int64_t> batch, std::size_t micro) {
  const parallel::Slice share = step.share(micro);
  MINIDL_CHECK(static_cast<std::int64_t>(batch.size()) >= share.end,
               "gather: this rank takes samples [", share.begin, ", ", share.end,
               ") of the batch, but the batch has ", batch.size(), " indices");
  MINIDL_CHECK(samples.shape().rank() >= 1 && samples.shape()[0] >= 1, "gather: the samples ",
               samples.shape(), " are not [N, ...] with N >= 1");
  const std::int64_t count = samples.shape()[0];
  const auto* src = static_cast<const char*>(samples.raw());
  const auto* rows = static_cast<const char*>(targets.raw());
  for (CompiledStep::Part& part : step.parts(micro)) {
    const std::int64_t n = part.end - part.begin;
    const std::size_t x_row = row_bytes(samples, count, "samples", part.x, n);
    const std::size_t t_row = row_bytes(targets, count, "targets", part.target, n);
    auto* x = static_cast<char*>(part.x.raw());
    auto* t = static_cast<char*>(part.target.raw());
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t at = share.begin + part.begin + j;
      const std::int64_t i = batch[static_cast<std::size_t>(at)];
      MINIDL_CHECK(i >= 0 && i < count, "gather: index ", i, " at position ", at,
                   " of the batch is outside the ", count, " samples");
      std::memcpy(x + j * x_row, src + i * x_row, x_row);
      std::memcpy(t + j * t_row, rows + i * t_row, t_row);
    }
  }
}

}  // namespace minidl::train
