// Element types of stored tensors and the scalar conversions every backend shares.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace kimi {

enum class DType : uint8_t { kF32, kF16, kBF16, kU8, kI32, kI64, kF64 };

// Bytes per element; sub-byte formats (MXFP4) are stored as kU8 tensors.
inline int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kU8:
      return 1;
    case DType::kI64:
    case DType::kF64:
      return 8;
  }
  return 0;
}

// The names safetensors uses in its header.
const char* DTypeName(DType t);
bool ParseDType(std::string_view name, DType* out);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN (made quiet). A select rather than an
// early return for NaN, so that loops over it vectorise.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

}  // namespace kimi
