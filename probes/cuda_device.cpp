#include "probes/cuda_device.h"

#include <fmt/format.h>

namespace oomtune {

std::string cuda_version_text(int version) { return fmt::format("CUDA {}.{}", version / 1000, (version % 1000) / 10); }

std::string cuda_device_problem(const CudaDeviceFacts& f) {
  const std::string cpu = "; or use device = \"cpu\" (--device cpu)";
  if (!f.driver_library)
    return fmt::format(
        "no NVIDIA driver: libcuda.so.1 is not installed on this machine, and this PyTorch's {} "
        "runtime needs it; install the NVIDIA driver{}",
        cuda_version_text(f.runtime_version), cpu);
  if (f.runtime_error == kCudaErrorInsufficientDriver)
    return fmt::format("the NVIDIA driver runs up to {}, older than this PyTorch's {} runtime; update the driver{}",
                       f.driver_version > 0 ? cuda_version_text(f.driver_version) : "no CUDA version",
                       cuda_version_text(f.runtime_version), cpu);
  if (f.runtime_error == kCudaErrorNoDevice || (f.runtime_error == 0 && f.device_count == 0)) {
    if (f.visible_devices_set)
      return fmt::format(
          "no CUDA device is visible with CUDA_VISIBLE_DEVICES=\"{}\"; unset it or name a GPU "
          "that nvidia-smi lists{}",
          f.visible_devices, cpu);
    return fmt::format("no CUDA device is visible (the driver, {}, found none; nvidia-smi lists what it sees){}",
                       cuda_version_text(f.driver_version), cpu);
  }
  if (f.runtime_error != 0)
    return fmt::format("the CUDA runtime cannot use the GPU: {} ({}){}", f.error_name, f.error_text, cpu);
  return "";
}

}  // namespace oomtune
