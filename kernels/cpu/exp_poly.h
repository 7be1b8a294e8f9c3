// Cephes expf's range reduction and polynomial, and ExpNonPositive on it, for the kernels'
// vectorisable exps (kda.cc, mla.cc): plain float arithmetic, so a loop around it vectorises in
// every target clone. Private to kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/target_clones.h"

namespace kimi::cpu {

// For v in [-87.34, 88.38] (callers clamp): exp(v) = p * 2^e with e an integer in [-126, 128]
// (~1 ulp); returns p and sets e.
KIMI_INLINE float ExpPoly(float v, int32_t* e) {
  const float t = v * 1.44269504088896341f + 12582912.0f;  // round to nearest via 1.5 * 2^23
  const float f = t - 12582912.0f;
  int32_t ti;
  std::memcpy(&ti, &t, sizeof ti);
  *e = ti - 0x4b400000;  // = f as an integer
  float r = v - f * 0.693359375f;
  r = r - f * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * (r * r) + r + 1.0f;
}

// exp(x) for x <= 0 (clamped below at -87.34, where exp reaches the smallest normal float): one
// 2^e factor, as e <= 0.
KIMI_INLINE float ExpNonPositive(float x) {
  const float v = x < -87.3365447505531f ? -87.3365447505531f : x;
  int32_t e;
  const float p = ExpPoly(v, &e);
  const int32_t bits = (e + 127) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof s);
  return p * s;
}

}  // namespace kimi::cpu
