#pragma once
// Whether a trial can run on the GPU, said in one line when it cannot
// (issue #44, item 6). The facts are read by the CUDA runtime in a CUDA
// build (read_cuda_device_facts, probes/cuda_device_reader.cpp); the
// wording is here, apart, so that every case is tested without a GPU.

#include <cstdint>
#include <string>

namespace oomtune {

/// What the CUDA runtime said about the machine.
struct CudaDeviceFacts {
  bool driver_library = false;  // libcuda.so.1, the NVIDIA driver's user-space library, loads
  int runtime_error = 0;        // cudaGetDeviceCount's cudaError_t (0 = cudaSuccess)
  std::string error_name;       // cudaGetErrorName of it ("cudaErrorNoDevice")
  std::string error_text;       // cudaGetErrorString of it
  int device_count = 0;         // COUNT: visible devices (when runtime_error is 0)
  int runtime_version = 0;      // cudaRuntimeGetVersion: 13000 for CUDA 13.0
  int driver_version = 0;       // cudaDriverGetVersion: the newest CUDA the driver runs; 0 = no driver
  std::string visible_devices;  // CUDA_VISIBLE_DEVICES as set ("" when unset)
  bool visible_devices_set = false;
};

// cudaError_t values the wording tells apart (cuda_runtime_api.h,
// driver_types.h; the same in CUDA 11 to 13).
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;

/// "CUDA 13.0" for 13000.
std::string cuda_version_text(int version);

/// Why `device = "cuda"` cannot run here, as the end of one line ("no
/// NVIDIA driver: ..."), with what to do; "" when a device is there.
/// Cases: no driver library; a driver older than the runtime; no device
/// visible (CUDA_VISIBLE_DEVICES named when set); any other runtime error,
/// by its name and text.
std::string cuda_device_problem(const CudaDeviceFacts& facts);

/// The facts, from the CUDA runtime (cudaGetDeviceCount, cudaRuntimeGetVersion,
/// cudaDriverGetVersion) and dlopen("libcuda.so.1"). Defined in CUDA builds
/// only (OOMTUNE_WITH_CUDA; probes/cuda_device_reader.cpp). Never throws.
CudaDeviceFacts read_cuda_device_facts();

}  // namespace oomtune
