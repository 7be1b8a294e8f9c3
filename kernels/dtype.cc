#include "kernels/dtype.h"

#include <cmath>

namespace kimi {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kU8:
      return "U8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kF64:
      return "F64";
  }
  return "?";
}

bool ParseDType(std::string_view name, DType* out) {
  static constexpr struct {
    std::string_view name;
    DType type;
  } kNames[] = {{"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
                {"U8", DType::kU8},   {"I32", DType::kI32}, {"I64", DType::kI64},
                {"F64", DType::kF64}};
  for (const auto& n : kNames) {
    if (n.name == name) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal half: value = man * 2^-24
      float f = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&bits, &f, sizeof bits);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < 6.103515625e-05f) {                // subnormal half (or zero): round(a / 2^-24)
    return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
  }
  // Normal: keep 10 mantissa bits, round to nearest even.
  uint32_t abits = bits & 0x7fffffffu;
  abits += 0xfffu + ((abits >> 13) & 1u);
  const uint32_t exp = (abits >> 23) - 112;
  return sign | static_cast<uint16_t>((exp << 10) | ((abits >> 13) & 0x3ffu));
}

}  // namespace kimi
