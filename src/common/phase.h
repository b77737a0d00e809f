#pragma once
// The phases of one training step, in the order they run.

#include <array>
#include <cstddef>
#include <string_view>

namespace oomtune {

/// A phase of a training step. kLoad covers model load and input creation.
enum class Phase : int { kLoad = 0, kForward, kLoss, kBackward, kOptimizer, kNumPhases };

constexpr std::size_t kNumPhases = static_cast<std::size_t>(Phase::kNumPhases);

/// Lower-case name used in tables and JSON keys: "load", "forward", ...
constexpr std::string_view phase_name(Phase phase) {
  constexpr std::array<std::string_view, kNumPhases> kNames = {"load", "forward", "loss", "backward", "optimizer"};
  return kNames[static_cast<std::size_t>(phase)];
}

}  // namespace oomtune
