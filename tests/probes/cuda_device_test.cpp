// The one line a CUDA job gets where it cannot run on a GPU: every case,
// from facts written by hand as the CUDA runtime reports them.

#include "probes/cuda_device.h"

#include <gtest/gtest.h>

namespace oomtune {
namespace {

// A machine with a driver for CUDA 13.0 and one GPU.
CudaDeviceFacts a_gpu() {
  CudaDeviceFacts f;
  f.driver_library = true;
  f.device_count = 1;
  f.runtime_version = 13000;
  f.driver_version = 13000;
  return f;
}

TEST(CudaDevice, AGpuIsNoProblem) { EXPECT_EQ(cuda_device_problem(a_gpu()), ""); }

// This CI machine: the toolkit, no driver (cudaGetDeviceCount answers 35).
TEST(CudaDevice, NoDriverLibrary) {
  CudaDeviceFacts f = a_gpu();
  f.driver_library = false;
  f.runtime_error = kCudaErrorInsufficientDriver;
  f.driver_version = 0;
  EXPECT_EQ(cuda_device_problem(f),
            "no NVIDIA driver: libcuda.so.1 is not installed on this machine, and this PyTorch's CUDA 13.0 runtime "
            "needs it; install the NVIDIA driver; or use device = \"cpu\" (--device cpu)");
}

TEST(CudaDevice, ADriverOlderThanTheRuntime) {
  CudaDeviceFacts f = a_gpu();
  f.runtime_error = kCudaErrorInsufficientDriver;
  f.driver_version = 12040;
  EXPECT_EQ(cuda_device_problem(f),
            "the NVIDIA driver runs up to CUDA 12.4, older than this PyTorch's CUDA 13.0 runtime; update the driver; "
            "or use device = \"cpu\" (--device cpu)");
}

TEST(CudaDevice, NoDeviceVisible) {
  CudaDeviceFacts f = a_gpu();
  f.runtime_error = kCudaErrorNoDevice;
  f.device_count = 0;
  EXPECT_EQ(cuda_device_problem(f),
            "no CUDA device is visible (the driver, CUDA 13.0, found none; nvidia-smi lists what it sees); or use "
            "device = \"cpu\" (--device cpu)");
  f.visible_devices_set = true;
  f.visible_devices = "";
  EXPECT_EQ(cuda_device_problem(f),
            "no CUDA device is visible with CUDA_VISIBLE_DEVICES=\"\"; unset it or name a GPU that nvidia-smi "
            "lists; or use device = \"cpu\" (--device cpu)");
  f.runtime_error = 0;  // some runtimes answer success and zero devices
  EXPECT_NE(cuda_device_problem(f), "");
}

TEST(CudaDevice, AnyOtherRuntimeErrorByItsName) {
  CudaDeviceFacts f = a_gpu();
  f.runtime_error = 999;
  f.error_name = "cudaErrorUnknown";
  f.error_text = "unknown error";
  EXPECT_EQ(cuda_device_problem(f),
            "the CUDA runtime cannot use the GPU: cudaErrorUnknown (unknown error); or use device = \"cpu\" "
            "(--device cpu)");
}

}  // namespace
}  // namespace oomtune
