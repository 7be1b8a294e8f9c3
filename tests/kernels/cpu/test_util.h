// Helpers shared by the CPU kernel tests: seeded random data and comparisons.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kimi::testing {

inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// E2M1 values, written from the OCP MX spec table (independent of the kernels' tables).
inline double E2m1(int code) {
  const int sign = code >> 3, exp = (code >> 1) & 3, man = code & 1;
  const double mag = exp == 0 ? 0.5 * man : std::ldexp(1.0 + 0.5 * man, exp - 1);
  return sign ? -mag : mag;
}

// The values of a row-major MXFP4 matrix [n, k] (two codes a byte, low nibble first; one E8M0
// scale per 32 columns): E2M1(code) * 2^(scale - 127), exact in double.
inline std::vector<double> Mxfp4Values(const std::vector<uint8_t>& codes,
                                       const std::vector<uint8_t>& scales, int64_t n, int64_t k) {
  std::vector<double> dense(n * k);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = codes[(r * k + c) / 2];
      dense[r * k + c] =
          E2m1(c % 2 ? byte >> 4 : byte & 0xf) * std::ldexp(1.0, scales[(r * k + c) / 32] - 127);
    }
  }
  return dense;
}

// max |a - b| / (tol_abs + tol_rel * |b|) <= 1 for every element.
inline double WorstRatio(const std::vector<float>& a, const std::vector<double>& b, double tol_abs,
                         double tol_rel) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / (tol_abs + tol_rel * std::fabs(b[i])));
  }
  return worst;
}

}  // namespace kimi::testing
