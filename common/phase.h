#pragma once
// The phases of one training step, in the order they run.

#include <array>
#include <cstddef>
#include <optional>
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

/// The phase named `name` (as phase_name writes it), or nullopt for any
/// other text.
constexpr std::optional<Phase> phase_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kNumPhases; ++i)
    if (phase_name(static_cast<Phase>(i)) == name) return static_cast<Phase>(i);
  return std::nullopt;
}

}  // namespace oomtune
