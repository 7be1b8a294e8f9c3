// Private to the AVX2 MatMul files (matmul_avx2.cc, matmul_avx2_lanes.cc): helpers both use.
// Include it after `#pragma GCC target("avx2,fma,f16c,bmi,bmi2")`; it defines no function that
// could run on a machine without AVX2.
#pragma once

#include <cstdint>
#include <type_traits>

#include <immintrin.h>

#define KIMI_ALWAYS_INLINE inline __attribute__((always_inline))

namespace kimi::cpu::matmul_internal::avx2 {

// 16 stored bf16 elements as the 8 even (e) and 8 odd (o) ones, in fp32: a bf16 pair per 32-bit
// word, the even element in the low half.
struct Bf16Split {
  using T = uint16_t;
  KIMI_ALWAYS_INLINE static void Apply(const uint16_t* p, __m256& e, __m256& o) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    // One load: GCC otherwise loads the 32 bytes again as the AND's memory operand (a third
    // fewer bytes per cycle in the batch-1 stream, measured).
    __asm__("" : "+x"(v));
    e = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    o = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
};

// Calls f(std::integral_constant<int, n>{}) for 0 < n < N equal to `count`, nothing otherwise: the
// last, shorter strip of a loop gets its own compile-time size.
template <int N, class F>
KIMI_ALWAYS_INLINE void WithRemainder(int64_t count, F&& f) {
  if constexpr (N > 1) {
    if (count == N - 1) {
      f(std::integral_constant<int, N - 1>{});
    } else {
      WithRemainder<N - 1>(count, f);
    }
  }
}

}  // namespace kimi::cpu::matmul_internal::avx2
