// The progress bar's text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/app/progress.hpp"

namespace minidl {
namespace {

using ::testing::HasSubstr;

TEST(Progress, BarFitsTheTerminalAndShowsEverything) {
  const ProgressState s{.epoch = 2,
                        .epochs = 20,
                        .done = 30000,
                        .epoch_size = 60000,
                        .samples_per_second = 15234.4,
                        .loss = 0.28711,
                        .eta_seconds = 83};
  const std::string line = format_progress(s, 100);
  EXPECT_THAT(line, HasSubstr("epoch  2/20 [###############---------------]  50%"));
  EXPECT_THAT(line, HasSubstr("15234 samples/s  loss 0.2871  ETA 1:23"));
  EXPECT_LE(line.size(), 99u);
  EXPECT_LE(format_progress(s, 60).size(), 59u);  // a narrower bar, or none
  EXPECT_THAT(format_progress(s, 60), HasSubstr("ETA"));
  EXPECT_EQ(format_duration(9.4), "0:09");
  EXPECT_EQ(format_duration(3903), "1:05:03");
  EXPECT_THAT(format_progress({.epoch = 1, .epochs = 1, .epoch_size = 10}, 80), HasSubstr("ETA ?"));
}

}  // namespace
}  // namespace minidl
