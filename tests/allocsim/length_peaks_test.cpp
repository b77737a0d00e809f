// phase_live_peaks (allocsim/length_peaks.h) on a hand-made step whose live
// bytes are known at every moment: its phase peaks at lengths the model was
// not fitted at, including one where backward's peak has moved to another
// moment.

#include "allocsim/length_peaks.h"

#include <gtest/gtest.h>

namespace oomtune::allocsim {
namespace {

AllocEvent in(AllocEvent e, Phase phase) {
  e.phase = phase;
  return e;
}

// Forward makes A (512·T bytes) and the scores S (32·T²); backward frees
// the previous step's gradient (id 999, carried in), makes dS (32·T²),
// frees S, makes the gradient G (4096, carried out), frees dS and A.
LengthSample step_at(int64_t t) {
  LengthSample s;
  s.length = t;
  s.events = {in(alloc_event(1, 512 * t), Phase::kForward), in(alloc_event(2, 32 * t * t), Phase::kForward),
              in(free_event(999), Phase::kBackward),        in(alloc_event(3, 32 * t * t), Phase::kBackward),
              in(free_event(2), Phase::kBackward),          in(alloc_event(4, 4096), Phase::kBackward),
              in(free_event(3), Phase::kBackward),          in(free_event(1), Phase::kBackward)};
  return s;
}

TEST(LengthPeaks, EachPhasesPeakAtAnyLength) {
  const LengthModel model = LengthModel::fit({step_at(16), step_at(32), step_at(64)});
  for (int64_t t : {8, 1024}) {
    const auto peaks = phase_live_peaks(model, t);
    // The previous step's G (4096) is alive until backward frees it.
    const int64_t forward = 4096 + 512 * t + 32 * t * t;
    // Backward: what forward left, or later S and dS together (A alive).
    const int64_t backward = std::max(forward, 512 * t + 64 * t * t);
    EXPECT_EQ(peaks[static_cast<std::size_t>(Phase::kForward)], forward) << "T = " << t;
    EXPECT_EQ(peaks[static_cast<std::size_t>(Phase::kBackward)], backward) << "T = " << t;
    EXPECT_EQ(peaks[static_cast<std::size_t>(Phase::kOptimizer)], 0) << "T = " << t;
  }
  // At T = 8 backward's peak is forward's leftovers; at 1024, S with dS.
  EXPECT_EQ(phase_live_peaks(model, 8)[static_cast<std::size_t>(Phase::kBackward)], 4096 + 512 * 8 + 32 * 64);
  EXPECT_EQ(phase_live_peaks(model, 1024)[static_cast<std::size_t>(Phase::kBackward)], 512 * 1024 + 64 * 1024 * 1024);
}

}  // namespace
}  // namespace oomtune::allocsim
