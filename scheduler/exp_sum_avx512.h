// The logprobs' softmax normaliser on AVX-512 (sampling.cc's LogSumExp): private to the scheduler.
#pragma once

#include <cstddef>

namespace kimi::sched {

// Sum over x[0, n) of exp(x[i] - top), in double, for top >= every x[i] (a NaN anywhere gives
// NaN; an exp below 2^-126 counts as 2^-126 times its polynomial, as the portable loop clamps too).
// Each exp is within about 1e-7 relative (a degree-6 polynomial for 2^f, |f| <= 1/2, evaluated in
// float), so the sum is too. The first ahead_n values of `ahead` (null: none) are prefetched into
// L2 alongside: the row the thread samples next. Call only where cpu::HasAvx512(cpu::MatMulIsa()).
double ExpSumAvx512(const float* x, size_t n, float top, const float* ahead, size_t ahead_n);

}  // namespace kimi::sched
