// L floats as one value (GCC vector types) for kernels built once per instruction-set level: L = 16
// in an AVX-512 build (one 512-bit register), 8 in an AVX2 build, 4 in the baseline. Every function
// taking one is inlined into those builds, so the ABI note GCC gives for the baseline does not
// apply. Private to kernels/cpu.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/target_clones.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kimi::cpu {

template <int L>
struct LaneVec;
template <>
struct LaneVec<16> {
  typedef float V __attribute__((vector_size(64)));
};
template <>
struct LaneVec<8> {
  typedef float V __attribute__((vector_size(32)));
};
template <>
struct LaneVec<4> {
  typedef float V __attribute__((vector_size(16)));
};

template <int L>
KIMI_INLINE typename LaneVec<L>::V Load(const float* p) {
  typename LaneVec<L>::V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// The first n < L floats at p, the rest zero.
template <int L>
KIMI_INLINE typename LaneVec<L>::V LoadPartial(const float* p, int64_t n) {
  typename LaneVec<L>::V v = {};
  std::memcpy(&v, p, n * sizeof(float));
  return v;
}
template <int L>
KIMI_INLINE void Store(float* p, typename LaneVec<L>::V v) {
  std::memcpy(p, &v, sizeof v);
}

// The lanes summed in a fixed tree: halves, then quarters, then pairs.
KIMI_INLINE float SumLanes(LaneVec<4>::V b) { return (b[0] + b[2]) + (b[1] + b[3]); }
KIMI_INLINE float SumLanes(LaneVec<8>::V a) {
  return SumLanes(LaneVec<4>::V(__builtin_shufflevector(a, a, 0, 1, 2, 3) +
                                __builtin_shufflevector(a, a, 4, 5, 6, 7)));
}
KIMI_INLINE float SumLanes(LaneVec<16>::V v) {
  return SumLanes(LaneVec<8>::V(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)));
}

}  // namespace kimi::cpu

#pragma GCC diagnostic pop
