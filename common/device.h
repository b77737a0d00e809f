#pragma once
// Device: where a job's training step runs and is measured. No libtorch
// here (the session maps it to an at::Device). Job TOML, plan.toml and the
// JSON records write it by name: "cpu", "cuda", "meta".

#include <array>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oomtune {

/// The device a job's tensors live on.
enum class Device : int {
  kCpu = 0,  ///< host memory, counted by the CPU memory tracker (probes/memory_tracker.h)
  kCuda,     ///< a CUDA GPU, measured by the caching allocator's statistics
  kMeta,     ///< PyTorch's meta device: shapes without data, bytes counted, no compute (issue #46)
  kNumDevices
};

constexpr std::size_t kNumDevices = static_cast<std::size_t>(Device::kNumDevices);

/// The device's name as job TOML, plan.toml and JSON write it: "cpu",
/// "cuda", "meta".
constexpr std::string_view device_name(Device device) {
  constexpr std::array<std::string_view, kNumDevices> kNames = {"cpu", "cuda", "meta"};
  return kNames[static_cast<std::size_t>(device)];
}

/// The device named `name` (as device_name writes it), or nullopt for any
/// other text (the caller says where the text came from).
constexpr std::optional<Device> device_from_name(std::string_view name) {
  for (std::size_t i = 0; i < kNumDevices; ++i)
    if (device_name(static_cast<Device>(i)) == name) return static_cast<Device>(i);
  return std::nullopt;
}

/// The names of `devices`, for a "valid: ..." list and TOML choices.
inline std::vector<std::string> device_names(std::initializer_list<Device> devices) {
  std::vector<std::string> names;
  for (const Device d : devices) names.emplace_back(device_name(d));
  return names;
}

}  // namespace oomtune
