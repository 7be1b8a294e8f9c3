// The logprobs' softmax normaliser on AVX-512 (sampling.cc's LogSumExp): private to the scheduler.
#pragma once

#include <cstddef>

namespace kimi::sched {

// Sum over x[0, n) of exp(x[i] - top), in double, for top >= every x[i] (a NaN anywhere gives
// NaN; an exp below 2^-126 counts as 2^-126 times its polynomial, as the portable loop clamps too).
// Each exp is within about 1.2e-7 relative near the top (a degree-6 polynomial for 2^f, |f| <= 1/2,
// evaluated in float), more further below it (t = (x - top) log2(e) is rounded to float: 3e-7 at
// x - top in [-5, -1], 1e-6 in [-20, -5]), so the sum is within about 1e-7 when its mass lies near
// the top, as in a model's rows, and up to a few 1e-7 when it lies far below (a flat row); the
// portable loop's stays under 1e-7 throughout. The first ahead_n values of `ahead` (null: none) are
// prefetched into L2 alongside: the row the thread samples next. Call only where
// cpu::HasAvx512(cpu::MatMulIsa()).
double ExpSumAvx512(const float* x, size_t n, float top, const float* ahead, size_t ahead_n);

// The row's run maxima, its largest value and ExpSumAvx512 against it, in one pass over x[0, n)
// (sampling.cc's maxima and logprobs' normaliser, which otherwise read the row twice):
// maxima[r] = the largest of x[64 r, 64 r + 64) for each whole run of 64 (NaNs passed over; -inf
// for none), *top = the largest value (NaNs passed over; -inf for none), and the return: the sum
// of exp(x[i] - *top) in double (0 when *top is -inf and no value is NaN). Each 128-value step's
// exps are taken against the largest value up to that step, and the sum so far is scaled by
// exp(previous - new) in double whenever that value grows; each exp has ExpSumAvx512's error, so
// the sum keeps its bound. A NaN anywhere gives NaN.
double RunMaximaExpSumAvx512(const float* x, size_t n, float* maxima, float* top);

}  // namespace kimi::sched
