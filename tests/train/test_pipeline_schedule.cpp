// Pipeline schedules as data (train/pipeline.hpp), without MPI: the GPipe and 1F1B generators'
// lists for 1-4 stages and 1-8 micro-batches pass the checks (every backward after its forward,
// the receives before what reads them, the stash slots within their bound) and a replay of all
// stages' lists together ends; broken lists are refused naming the stage, the action and the
// partner.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "minidl/train/pipeline.hpp"
#include "support/error_of.hpp"

using namespace minidl;
using minidl::testing::error_of;
using train::PipelineAction;
using Kind = PipelineAction::Kind;
using ::testing::HasSubstr;

namespace {

std::size_t find(const std::vector<PipelineAction>& list, Kind k, int m) {
  for (std::size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == k && list[i].micro == m) return i;
  return list.size();
}

TEST(PipelineSchedule, GeneratorsPassTheChecksAndTheReplay) {
  for (const std::string kind : {"gpipe", "1f1b"}) {
    for (int p = 1; p <= 4; ++p) {
      for (int m = 1; m <= 8; ++m) {
        SCOPED_TRACE(kind + " " + std::to_string(p) + " stages, " + std::to_string(m) + " micro");
        const auto schedule = train::make_schedule(kind, p, m);
        ASSERT_EQ(schedule.size(), static_cast<std::size_t>(p));
        std::vector<int> slots;
        ASSERT_NO_THROW(slots = train::check_schedule(schedule, m));
        for (int s = 0; s < p; ++s) {
          const auto& list = schedule[static_cast<std::size_t>(s)];
          for (int i = 0; i < m; ++i) {
            const std::size_t f = find(list, Kind::Forward, i), b = find(list, Kind::Backward, i);
            ASSERT_LT(f, list.size());
            ASSERT_LT(b, list.size());
            EXPECT_LT(f, b) << "backward " << i << " before its forward on stage " << s;
          }
          EXPECT_EQ(list.back().kind, Kind::Update);
          // GPipe stashes every micro-batch; 1F1B at most P - stage.
          const int bound = kind == "gpipe" ? m : std::min(m, p - s);
          EXPECT_EQ(slots[static_cast<std::size_t>(s)], bound) << "stage " << s;
        }
      }
    }
  }
}

TEST(PipelineSchedule, ADeadlockIsRefusedNamingStageActionAndPartner) {
  // Stage 1 waits for micro-batch 1's activation first while stage 0 sends 0 first: both
  // block in their sends and receives.
  auto schedule = train::make_schedule("gpipe", 2, 2);
  auto& s1 = schedule[1];
  const std::size_t r0 = find(s1, Kind::RecvActivation, 0), r1 = find(s1, Kind::RecvActivation, 1);
  const std::size_t f0 = find(s1, Kind::Forward, 0), f1 = find(s1, Kind::Forward, 1);
  std::swap(s1[r0], s1[r1]);
  std::swap(s1[f0], s1[f1]);
  const std::string e = error_of([&] { train::check_schedule(schedule, 2); });
  EXPECT_THAT(e, HasSubstr("stage 0"));
  EXPECT_THAT(e, HasSubstr("send-act0->1"));
  EXPECT_THAT(e, HasSubstr("partner, stage 1"));
  EXPECT_THAT(e, HasSubstr("recv-act1<-0"));
}

TEST(PipelineSchedule, BrokenListsAreRefused) {
  {
    auto schedule = train::make_schedule("gpipe", 2, 2);
    auto& s0 = schedule[0];
    // The backward of micro-batch 0 before its forward.
    const std::size_t f = find(s0, Kind::Forward, 0), b = find(s0, Kind::Backward, 0);
    std::swap(s0[f], s0[b]);
    const std::string e = error_of([&] { train::check_schedule(schedule, 2); });
    EXPECT_THAT(e, HasSubstr("stage 0"));
    EXPECT_THAT(e, HasSubstr("B0"));
  }
  {
    auto schedule = train::make_schedule("gpipe", 2, 2);
    // A receive with no send: stage 1 never gets micro-batch 1's gradient sent.
    auto& s1 = schedule[1];
    s1.erase(s1.begin() + static_cast<std::ptrdiff_t>(find(s1, Kind::SendGradient, 1)));
    const std::string e = error_of([&] { train::check_schedule(schedule, 2); });
    EXPECT_THAT(e, HasSubstr("stage 1 never sends micro-batch 1's gradient to stage 0"));
  }
  {
    auto schedule = train::make_schedule("1f1b", 3, 4);
    schedule[2].push_back(schedule[2].front());  // an action twice, after the update
    const std::string e = error_of([&] { train::check_schedule(schedule, 4); });
    EXPECT_THAT(e, HasSubstr("stage 2"));
    EXPECT_THAT(e, HasSubstr("appears twice"));
  }
  EXPECT_THAT(error_of([] { train::make_schedule("zigzag", 2, 2); }),
              HasSubstr("--schedule zigzag (expected gpipe or 1f1b)"));
}

TEST(PipelineSchedule, FormatListsEveryStage) {
  const std::string text = train::format_schedule(train::make_schedule("gpipe", 2, 2));
  EXPECT_EQ(text,
            "stage 0 (rank 0): F0 send-act0->1 F1 send-act1->1 recv-grad1<-1 B1 recv-grad0<-1 B0 "
            "update\n"
            "stage 1 (rank 1): recv-act0<-0 F0 recv-act1<-0 F1 B1 send-grad1->0 B0 send-grad0->0 "
            "update\n");
}

}  // namespace
