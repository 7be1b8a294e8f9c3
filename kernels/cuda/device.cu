#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/cuda/check.h"

namespace kimi::cuda {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string DescribeDevice() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(err);
  }
  if (n == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return "CUDA device 0 (properties unavailable)";
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
}

absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) {
  cudaDeviceProp prop{};
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  DeviceInfo info;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
    cudaGetLastError();
    clock_khz = bus_bits = 0;
  }
  info.peak_bandwidth = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  const std::string name = info.name;
  if (name.find("H200") != std::string::npos) info.peak_bandwidth = 4.8e12;
  else if (name.find("H100") != std::string::npos && name.find("PCIe") == std::string::npos)
    info.peak_bandwidth = 3.35e12;
  else if (name.find("A100") != std::string::npos && name.find("80GB") != std::string::npos)
    info.peak_bandwidth = 2.039e12;
  if (const char* env = std::getenv("KIMI_PEAK_HBM_GBS")) {
    const double gbs = std::atof(env);
    if (gbs > 0) info.peak_bandwidth = gbs * 1e9;
  }
  return info;
}

}  // namespace kimi::cuda
