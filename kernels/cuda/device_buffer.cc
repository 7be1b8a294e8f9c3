#include "kernels/cuda/device_buffer.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"

namespace kimi::cuda {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int64_t bytes) {
  DeviceBuffer b;
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("DeviceBuffer: ", bytes, " bytes"));
  if (bytes == 0) return b;
  const cudaError_t err = cudaMalloc(&b.ptr_, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    cudaGetLastError();
    b.ptr_ = nullptr;
    return CudaStatus(err, absl::StrCat("cudaMalloc of ", bytes, " bytes").c_str());
  }
  b.bytes_ = bytes;
  return b;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Zeroed(int64_t bytes) {
  absl::StatusOr<DeviceBuffer> b = Allocate(bytes);
  if (!b.ok() || bytes == 0) return b;
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaMemset(b->get(), 0, static_cast<size_t>(bytes)), "cudaMemset"));
  return b;
}

void DeviceBuffer::Reset() {
  if (ptr_) cudaFree(ptr_);  // a failure here leaves nothing to recover
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
                    "cudaMemcpy host to device");
}

absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost),
                    "cudaMemcpy device to host");
}

}  // namespace kimi::cuda
