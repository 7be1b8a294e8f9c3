// Errors of the CUDA runtime, cuBLASLt and kernel launches as absl::Status (host-only header).
// Nothing in the CUDA backend aborts or throws on a failed call: every launcher and wrapper
// returns a status naming what failed.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace kimi::cuda {

// OkStatus for cudaSuccess; otherwise Internal (ResourceExhausted for out of memory) naming
// `what` and the CUDA error.
absl::Status CudaStatus(cudaError_t err, const char* what);

// The launch error of the kernel just launched (cudaGetLastError), named.
absl::Status LaunchStatus(const char* kernel);

}  // namespace kimi::cuda

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define KIMI_RETURN_IF_ERROR(expr)                   \
  do {                                               \
    const absl::Status kimi_status_ = (expr);        \
    if (!kimi_status_.ok()) return kimi_status_;     \
  } while (0)
