#pragma once
// The live bytes of a step at any sequence length, phase by phase, from its
// LengthModel (allocsim/length_model.h): exact where the model is, since
// every request is c0 + c1·T + c2·T² and the order of allocs and frees does
// not change with T (issue #47).
//
// Why not fit the phase's peak itself: a phase's peak is the largest of its
// moments' live bytes, each a quadratic in T, and the moment that holds it
// moves with T (on the eager LoRA Llama, between 512 and 1024 tokens
// backward's peak moves to a moment with one more B·heads·T² tensor alive).
// A quadratic fitted to the peaks of short lengths misses that; the largest
// of the moments at the length asked does not.
//
// Rules:
// - The walk starts with the step's carried-out allocations of the step
//   before alive (gradients kept for the next step), at the same length;
//   the k-th carried-in free releases the k-th of them.
// - The bytes alive before the step that the events do not show (weights,
//   optimizer state, buffers) are not counted: the caller adds them.
// No libtorch.

#include <array>
#include <cstdint>

#include "allocsim/length_model.h"
#include "common/phase.h"

namespace oomtune::allocsim {

/// BYTES: per phase (indexed by Phase), the most bytes the step's own
/// allocations hold at once during that phase at length `length` (>= 1),
/// counted from the step's start (0 for a phase without events). Throws
/// InputError for length < 1 (LengthModel::at).
std::array<int64_t, kNumPhases> phase_live_peaks(const LengthModel& model, int64_t length);

}  // namespace oomtune::allocsim
