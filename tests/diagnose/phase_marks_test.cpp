// oomtune's phase marks (diagnose/phase_marks.h) turned into spans by hand:
// every expectation is read off the marks listed in each test.

#include "diagnose/phase_marks.h"

#include <gtest/gtest.h>

namespace oomtune::diagnose {
namespace {

// The phase of the span holding `time_us`; kUnknown outside every span.
Phase phase_at(const std::vector<PhaseSpan>& spans, int64_t time_us) {
  const PhaseSpan* span = span_at(spans, time_us);
  return span ? span->phase : Phase::kUnknown;
}

Annotation mark(const std::string& name, const std::string& stage, int64_t time_us, int64_t device = 0) {
  return {name, stage, device, time_us};
}

TEST(PhaseMarks, StartAndEndMarksMakeSpansAndOtherMarksAreIgnored) {
  const std::vector<Annotation> marks = {
      mark("oomtune:backward", "START", 300),  // out of order in the file: sorted by time
      mark("oomtune:forward", "START", 100),   mark("oomtune:forward", "END", 200),
      mark("## user code ##", "START", 150),    // the user's record_function: not ours
      mark("oomtune:optimizer", "START", 500),  // opens while backward is open: closes it
      mark("oomtune:forward", "END", 600),      // an END of another phase: ignored
      mark("oomtune:forward", "START", 50, 1),  // another device
  };
  const std::vector<PhaseSpan> spans = oomtune_phase_spans(marks, 0);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].phase, Phase::kForward);
  EXPECT_EQ(spans[0].begin_us, 100);
  EXPECT_EQ(spans[0].end_us, 200);
  EXPECT_EQ(spans[1].phase, Phase::kBackward);
  EXPECT_EQ(spans[1].end_us, 500);
  EXPECT_EQ(spans[2].phase, Phase::kOptimizer);
  EXPECT_EQ(spans[2].end_us, INT64_MAX) << "never closed: the trial stopped inside it";

  EXPECT_EQ(phase_at(spans, 99), Phase::kUnknown);
  EXPECT_EQ(phase_at(spans, 100), Phase::kForward);
  EXPECT_EQ(phase_at(spans, 199), Phase::kForward);
  EXPECT_EQ(phase_at(spans, 250), Phase::kUnknown) << "between forward's END and backward's START";
  EXPECT_EQ(phase_at(spans, 499), Phase::kBackward);
  EXPECT_EQ(phase_at(spans, 10'000), Phase::kOptimizer);
  EXPECT_EQ(oomtune_phase_spans(marks, 1).size(), 1u);
}

TEST(PhaseMarks, LossIsForwardAndLoadIsOtherMarkedAsLoad) {
  const std::vector<PhaseSpan> spans =
      oomtune_phase_spans({mark("oomtune:load", "START", 1), mark("oomtune:load", "END", 2),
                           mark("oomtune:loss", "START", 3), mark("oomtune:loss", "END", 4)},
                          0);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].phase, Phase::kOther);
  EXPECT_TRUE(spans[0].load);
  EXPECT_EQ(spans[1].phase, Phase::kForward);
  EXPECT_FALSE(spans[1].load);
  EXPECT_TRUE(oomtune_phase_spans({mark("oomtune:unknown", "START", 1)}, 0).empty());
}

}  // namespace
}  // namespace oomtune::diagnose
