// Device memory owned by RAII (host-only header). Move-only; freed on destruction.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `bytes` of device memory (256-byte aligned, contents undefined); 0 bytes gives an empty
  // buffer. Out of memory is ResourceExhausted.
  static absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes);
  // Same, zero-filled (synchronously).
  static absl::StatusOr<DeviceBuffer> Zeroed(int64_t bytes);
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }
  void Reset();

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// Synchronous copies (for set-up and tests; the step itself uses the runner's stream).
absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes);
absl::Status CopyToHost(void* dst, const void* src, int64_t bytes);

}  // namespace kimi::cuda
