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

// Sixteen SumLanes at once, each in the same tree: r[4k + m] = SumLanes(v[4m + k]). A transposed
// reduction: 45 shuffles and adds where sixteen separate sums take about 128. (Stored through r: a
// 64-byte vector return would change the ABI of the builds without AVX-512.)
KIMI_INLINE void SumLanes16(const LaneVec<16>::V (&v)[16], float* r) {
  typedef LaneVec<16>::V V;
  V s1[8], s2[4], s3[2];
  for (int q = 0; q < 8; ++q) {  // halves: lanes l and l + 8 of v[2q], then of v[2q + 1]
    s1[q] = __builtin_shufflevector(v[2 * q], v[2 * q + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                    20, 21, 22, 23) +
            __builtin_shufflevector(v[2 * q], v[2 * q + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                    26, 27, 28, 29, 30, 31);
  }
  for (int q = 0; q < 4; ++q) {  // quarters: lanes l and l + 4 of each half, four vectors
    s2[q] = __builtin_shufflevector(s1[2 * q], s1[2 * q + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                    19, 24, 25, 26, 27) +
            __builtin_shufflevector(s1[2 * q], s1[2 * q + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21,
                                    22, 23, 28, 29, 30, 31);
  }
  for (int q = 0; q < 2; ++q) {  // pairs: (b0 + b2), (b1 + b3) of each quarter
    s3[q] = __builtin_shufflevector(s2[2 * q], s2[2 * q + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24,
                                    25, 12, 13, 28, 29) +
            __builtin_shufflevector(s2[2 * q], s2[2 * q + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11,
                                    26, 27, 14, 15, 30, 31);
  }
  Store<16>(r, __builtin_shufflevector(s3[0], s3[1], 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12,
                                       14, 28, 30) +
                   __builtin_shufflevector(s3[0], s3[1], 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27,
                                           13, 15, 29, 31));
}

}  // namespace kimi::cpu

#pragma GCC diagnostic pop
