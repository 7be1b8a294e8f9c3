// Device discovery and errors for the CUDA backend (host-only header).
#pragma once

#include <string>

namespace kimi::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error).
int DeviceCount();

// Name and compute capability of device 0, or a sentence saying why there is none.
std::string DescribeDevice();

}  // namespace kimi::cuda
