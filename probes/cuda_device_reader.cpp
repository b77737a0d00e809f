// CUDA builds only: what the CUDA runtime says about this machine
// (probes/cuda_device.h).
#include <dlfcn.h>

#include <cstdlib>

#include <cuda_runtime_api.h>

#include "probes/cuda_device.h"

namespace oomtune {

CudaDeviceFacts read_cuda_device_facts() {
  CudaDeviceFacts f;
  if (void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    f.driver_library = true;
    ::dlclose(driver);
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  f.runtime_error = static_cast<int>(error);
  f.error_name = cudaGetErrorName(error);
  f.error_text = cudaGetErrorString(error);
  f.device_count = error == cudaSuccess ? count : 0;
  cudaRuntimeGetVersion(&f.runtime_version);
  cudaDriverGetVersion(&f.driver_version);
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    f.visible_devices_set = true;
    f.visible_devices = visible;
  }
  return f;
}

}  // namespace oomtune
