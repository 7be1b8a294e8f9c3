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
