// Device discovery for the CUDA backend (host-only header).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kimi::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error).
int DeviceCount();

// Name and compute capability of device 0, or a sentence saying why there is none.
std::string DescribeDevice();

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  int64_t memory_bytes = 0;
  // Peak HBM bandwidth in bytes/s: the datasheet figure for known parts (H200, H100, A100),
  // else 2 x memory clock x bus width from the driver; $KIMI_PEAK_HBM_GBS overrides both.
  double peak_bandwidth = 0.0;
};
absl::StatusOr<DeviceInfo> GetDeviceInfo(int device);

}  // namespace kimi::cuda
