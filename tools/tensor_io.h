// Reading named fp32 tensors from a .safetensors file and writing results, for the command-line
// tools that check kernels against outside references.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace kimi::tools {

struct HostTensor {
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  std::vector<float> f32;    // float and integer inputs, converted
  std::vector<uint8_t> u8;   // raw bytes of U8 inputs (MXFP4)
  std::vector<int32_t> i32;  // I32 outputs
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

using TensorMap = std::map<std::string, HostTensor>;

absl::StatusOr<TensorMap> ReadTensors(const std::string& path);
absl::Status WriteTensors(const std::string& path, const TensorMap& tensors);

// Shorthands for ops: a required tensor with an expected rank, or an optional scalar.
absl::StatusOr<const HostTensor*> Need(const TensorMap& in, const std::string& name, size_t rank);
float ScalarOr(const TensorMap& in, const std::string& name, float fallback);

inline HostTensor F32(std::vector<int64_t> shape) {
  HostTensor t;
  t.shape = std::move(shape);
  t.f32.assign(t.numel(), 0.0f);
  return t;
}

}  // namespace kimi::tools
