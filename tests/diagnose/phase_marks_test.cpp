// Phase marks (diagnose/phase_marks.h), oomtune's and torch.optim's,
// turned into spans by hand: every expectation is read off the marks
// listed in each test.

#include "diagnose/phase_marks.h"

#include <gtest/gtest.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "common/gzip_file.h"
#include "test_support.h"

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
  const std::vector<PhaseSpan> spans = marked_phase_spans(marks, 0);
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
  EXPECT_EQ(marked_phase_spans(marks, 1).size(), 1u);
}

TEST(PhaseMarks, LossIsForwardAndLoadIsOtherMarkedAsLoad) {
  const std::vector<PhaseSpan> spans =
      marked_phase_spans({mark("oomtune:load", "START", 1), mark("oomtune:load", "END", 2),
                          mark("oomtune:loss", "START", 3), mark("oomtune:loss", "END", 4)},
                         0);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].phase, Phase::kOther);
  EXPECT_TRUE(spans[0].load);
  EXPECT_EQ(spans[1].phase, Phase::kForward);
  EXPECT_FALSE(spans[1].load);
  EXPECT_TRUE(marked_phase_spans({mark("oomtune:unknown", "START", 1)}, 0).empty());
}

TEST(PhaseMarks, TorchOptimsStepMarkIsTheOptimizerAndNamesItsClass) {
  // torch/optim/optimizer.py: record_function(f"Optimizer.step#{cls}.step");
  // zero_grad's mark and names that only look alike are no phase.
  const std::vector<PhaseSpan> spans = marked_phase_spans(
      {mark("Optimizer.zero_grad#AdamW.zero_grad", "START", 1), mark("Optimizer.zero_grad#AdamW.zero_grad", "END", 2),
       mark("Optimizer.step#AdamW.step", "START", 10), mark("Optimizer.step#AdamW.step", "END", 20),
       mark("Optimizer.step#.step", "START", 30), mark("Optimizer.step#Lion", "START", 31),
       mark("Optimizer.step#AdamW8bit.step", "START", 40)},
      0);
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].phase, Phase::kOptimizer);
  EXPECT_EQ(spans[0].source, MarkSource::kOptimizerStep);
  EXPECT_EQ(spans[0].optimizer_class, "AdamW");
  EXPECT_EQ(spans[0].begin_us, 10);
  EXPECT_EQ(spans[0].end_us, 20);
  EXPECT_EQ(spans[1].optimizer_class, "AdamW8bit");
  EXPECT_EQ(spans[1].end_us, INT64_MAX);
  EXPECT_EQ(phase_at(spans, 1), Phase::kUnknown);
  EXPECT_EQ(phase_at(spans, 35), Phase::kUnknown);
}

TEST(PhaseMarks, AWrappersStepHoldsTheInnerOptimizersStep) {
  // A wrapper optimizer (ZeroRedundancyOptimizer, a lookahead) whose step
  // calls the inner optimizer's: one span, the outer's, to its own END.
  const std::vector<PhaseSpan> spans = marked_phase_spans(
      {mark("Optimizer.step#ZeroRedundancyOptimizer.step", "START", 10), mark("Optimizer.step#AdamW.step", "START", 11),
       mark("Optimizer.step#AdamW.step", "END", 15), mark("Optimizer.step#ZeroRedundancyOptimizer.step", "END", 20)},
      0);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].optimizer_class, "ZeroRedundancyOptimizer");
  EXPECT_EQ(spans[0].end_us, 20);
  EXPECT_EQ(phase_at(spans, 17), Phase::kOptimizer);
}

TEST(PhaseMarks, AFramelessOptimizerStepIsReadFromTorchOptimsMark) {
  // frameless_optimizer_oom.pickle (make_snapshot_fixtures.py): a run
  // recorded without frames whose first AdamW step makes 5 states of
  // 12 MiB and fails at the 6th, inside "Optimizer.step#AdamW.step".
  const Diagnosis d = testing::diagnose_file(testing::synthetic_fixture("frameless_optimizer_oom.pickle"));
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kOptimizer);
  EXPECT_EQ(testing::alive_bytes(d.ooms[0], Category::kOptimizerState), 5 * 12 * kMiB);
  EXPECT_EQ(d.trace.frameless_in_optimizer_marks, 5);
  EXPECT_EQ(d.trace.alloc_events_in_marked_phases, 0);  // oomtune's own marks: none
  ASSERT_NE(d.optimizer, nullptr);
  EXPECT_EQ(d.optimizer->name, "AdamW");
  ASSERT_FALSE(d.verdicts.empty());
  EXPECT_EQ(d.verdicts.front().id, VerdictId::kOptimizerStateAllocation);
  // The same run without the mark: its frameless step cannot be placed.
  const Diagnosis unmarked =
      testing::diagnose_file(testing::synthetic_fixture("frameless_optimizer_oom_unmarked.pickle"));
  ASSERT_EQ(unmarked.ooms.size(), 1u);
  EXPECT_NE(unmarked.ooms[0].phase, Phase::kOptimizer);
  EXPECT_EQ(unmarked.optimizer, nullptr);
  EXPECT_EQ(unmarked.trace.frameless_in_optimizer_marks, 0);
}

TEST(PhaseMarks, FramedEventsInsideTheStepMarkKeepWhatTheirFramesSay) {
  // The H200 recordings carry the mark around each step; their frames name
  // the optimizer already, so no frameless event is placed by it.
  const std::string path = testing::synthetic_fixture("h200_recorded/first_adamw_step_1.pickle.gz");
  std::string bytes;
  try {
    bytes = read_gzip_file(path);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();  // a build without zlib
  }
  const Snapshot s = load_snapshot_bytes(bytes, path);
  ASSERT_EQ(marked_phase_spans(s.annotations, 0).size(), 1u);
  const Diagnosis d = diagnose(s, path, DiagnoseOptions{});
  EXPECT_EQ(d.trace.frameless_in_optimizer_marks, 0);
  ASSERT_EQ(d.ooms.size(), 1u);
  EXPECT_EQ(d.ooms[0].phase, Phase::kOptimizer);
}

}  // namespace
}  // namespace oomtune::diagnose
