// GCC 12 reports its own _mm512_undefined_* helpers as uninitialised (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "scheduler/exp_sum_avx512.h"

#include <algorithm>
#include <cmath>

#include <immintrin.h>

namespace kimi::sched {
namespace {

#define KIMI_AVX512 __attribute__((target("avx512f,avx512dq")))

// exp(d) for d <= 0 on 16 lanes, as 2^t with t = d log2(e): 2^round(t) by vscalefps and 2^f, f = t
// - round(t) (vreduceps, exact), by a polynomial fitted here for relative error over [-1/2, 1/2]
// (1.6e-8 with these float coefficients in exact arithmetic, 8e-8 evaluated in float). t's own
// rounding (2^-24 of |t|) moves exps far below the row's largest (see the header for how far),
// which weigh little in a model's rows: there the normaliser stays within 1e-7
// (tests/scheduler/exp_sum_avx512_test.cc). The portable loop's exp (sampling.cc,
// ExpNonPositive16) takes about 19 vector operations a lane group, this 12: 22 -> 13 us per
// 100,512-token row on one thread, in cache. t is clamped at -126 (a NaN stays NaN: vmaxps returns
// its second operand then) so no result is subnormal and -inf gives 2^-126 p, not NaN. The
// activations' Cephes exp (kernels/cpu/activation.cc, Exp512: ln2 in two parts, about 1 ulp at any
// distance from the top, 1e-9 / 4e-8 on a model-like / flat row) took 17.4 us a row against this
// 12.8, and scheduler.overhead.b64 0.031 against 0.028-0.030 in the same minutes (three runs each),
// over its 0.03 target: the logprobs are reported in float, whose ulp at -4 is already 4.8e-7.
KIMI_AVX512 inline __m512 ExpNonPositive16(__m512 d) {
  __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(1.44269504088896341f));
  t = _mm512_max_ps(_mm512_set1_ps(-126.0f), t);
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT);
  __m512 p = _mm512_set1_ps(1.5337577497e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399859890e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6185198054e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503290147e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022646248e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718246e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, _mm512_sub_ps(t, f));
}

KIMI_AVX512 inline __m512d Widen(__m256 half) { return _mm512_cvtps_pd(half); }

// One 128-value step of both sums: the eight vectors' exps against top, added in float as a tree
// (three roundings deep), the sum widened to double into lo (lanes 0-7) and hi (lanes 8-15).
KIMI_AVX512 inline void AddStep(const __m512 (&v)[8], __m512 top, __m512d& lo, __m512d& hi) {
  __m512 e[8];
  for (int h = 0; h < 8; ++h) e[h] = ExpNonPositive16(_mm512_sub_ps(v[h], top));
  const __m512 s =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3])),
                    _mm512_add_ps(_mm512_add_ps(e[4], e[5]), _mm512_add_ps(e[6], e[7])));
  lo = _mm512_add_pd(lo, Widen(_mm512_castps512_ps256(s)));
  hi = _mm512_add_pd(hi, Widen(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1))));
}

// The largest of acc's lanes after folding in v's (a NaN in v passed over: vmaxps returns its
// second operand when either is NaN, and acc never holds one).
KIMI_AVX512 inline __m512 FoldMax(__m512 acc, __m512 v) { return _mm512_max_ps(v, acc); }

// A sum of exps against m, now against m2 > m (exp(-inf) = 0 while m is -inf, the sum then 0).
KIMI_AVX512 inline void Grow(__m512d& lo, __m512d& hi, float& m, float m2) {
  const __m512d scale = _mm512_set1_pd(std::exp(static_cast<double>(m) - m2));
  lo = _mm512_mul_pd(lo, scale);
  hi = _mm512_mul_pd(hi, scale);
  m = m2;
}

// The lanes of a last, partial vector of `left` values (all 16 from 16 on).
inline __mmask16 LiveLanes(size_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
}

// The exps of the last values x[i, n) against top added to sum, up to 16 at a time, each 16 summed
// in float (lanes past n load top: unused).
KIMI_AVX512 inline void AddTail(double& sum, const float* x, size_t i, size_t n, __m512 top) {
  for (; i < n; i += 16) {
    const __mmask16 live = LiveLanes(n - i);
    const __m512 e = ExpNonPositive16(_mm512_sub_ps(_mm512_mask_loadu_ps(top, live, x + i), top));
    sum += _mm512_reduce_add_ps(_mm512_maskz_mov_ps(live, e));
  }
}

}  // namespace

// 128 values a step (AddStep), as the portable loop sums them.
KIMI_AVX512 double ExpSumAvx512(const float* x, size_t n, float top, const float* ahead,
                                size_t ahead_n) {
  const __m512 vtop = _mm512_set1_ps(top);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    if (i + 128 <= ahead_n) {
      for (int h = 0; h < 8; ++h)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + i + 16 * h), _MM_HINT_T1);
    }
    __m512 v[8];
    for (int h = 0; h < 8; ++h) v[h] = _mm512_loadu_ps(x + i + 16 * h);
    AddStep(v, vtop, lo, hi);
  }
  double sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  AddTail(sum, x, i, n, vtop);
  return sum;
}

// How far ahead of its loads RunMaximaExpSumAvx512 prefetches its row (floats; 8 KiB). The engine
// loop's rows were just written by the LM head and come from memory, and this pass's work per
// line leaves the hardware prefetcher behind: scheduler.overhead.b64 with steps alternated between
// this pass and the two passes (RunMaxima, then ExpSumAvx512 prefetching the next row), three runs
// of ten repeats each: 1.53-1.58 ms against 1.83-1.84 a step at 8 KiB ahead, 1.50-1.76 against
// 1.84-1.89 at 16, 1.82-1.89 against 1.80-1.93 at 4, 1.98-2.04 against 1.78-1.88 without.
constexpr size_t kRowAhead = 2048;

// 128 values (two runs) a step: the runs' maxima from the loaded vectors, then their exps against
// the largest value so far, summed as ExpSumAvx512 sums them. While that value is -inf (values so
// far all -inf or NaN) nothing is added but a NaN, which makes the sum NaN as it would against the
// true top.
KIMI_AVX512 double RunMaximaExpSumAvx512(const float* x, size_t n, float* maxima, float* top) {
  const __m512 minus_inf = _mm512_set1_ps(-INFINITY);
  float m = -INFINITY;  // the largest value so far
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  bool nan = false;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    if (i + kRowAhead + 128 <= n) {
      for (int h = 0; h < 8; ++h) {
        _mm_prefetch(reinterpret_cast<const char*>(x + i + kRowAhead + 16 * h), _MM_HINT_T0);
      }
    }
    __m512 v[8];
    for (int h = 0; h < 8; ++h) v[h] = _mm512_loadu_ps(x + i + 16 * h);
    __m512 run0 = minus_inf, run1 = minus_inf;
    for (int h = 0; h < 4; ++h) {
      run0 = FoldMax(run0, v[h]);
      run1 = FoldMax(run1, v[4 + h]);
    }
    const float r0 = _mm512_reduce_max_ps(run0), r1 = _mm512_reduce_max_ps(run1);
    maxima[i / 64] = r0;
    maxima[i / 64 + 1] = r1;
    const float step_max = std::max(r0, r1);
    if (step_max > m) Grow(lo, hi, m, step_max);
    if (m == -INFINITY) {  // every value so far -inf or NaN
      for (int h = 0; h < 8; ++h) nan |= _mm512_cmp_ps_mask(v[h], v[h], _CMP_UNORD_Q) != 0;
      continue;
    }
    AddStep(v, _mm512_set1_ps(m), lo, hi);
  }
  // The last values: a whole run of 64 if there is one, then fewer than 64 (in no run), folded
  // into one maximum.
  __m512 rest = minus_inf;
  size_t j = i;
  if (i + 64 <= n) {
    for (int h = 0; h < 4; ++h) rest = FoldMax(rest, _mm512_loadu_ps(x + i + 16 * h));
    maxima[i / 64] = _mm512_reduce_max_ps(rest);
    j += 64;
  }
  for (; j < n; j += 16) {
    rest = FoldMax(rest, _mm512_mask_loadu_ps(minus_inf, LiveLanes(n - j), x + j));
  }
  const float rest_max = _mm512_reduce_max_ps(rest);
  if (rest_max > m) Grow(lo, hi, m, rest_max);
  double sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
  if (m == -INFINITY) {  // every value -inf or NaN: nothing to add, only NaNs to look for
    for (size_t j = i; j < n; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(LiveLanes(n - j), x + j);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0;
    }
  } else {
    AddTail(sum, x, i, n, _mm512_set1_ps(m));
  }
  *top = m;
  return nan ? NAN : sum;
}

}  // namespace kimi::sched
