#include "kernels/cpu/causal_conv.h"

#include <cstring>

#include "kernels/cpu/activation.h"

namespace kimi::cpu {
namespace {

#define KIMI_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

// out[c] = sum_j w[c, j] * r[j][c], taps added in order j = 0 .. W-1. A compile-time W lets the
// compiler vectorise over channels (the stride-W weight loads become shuffles); the runtime form
// serves other kernel sizes.
template <int W>
inline void Taps(float* out, const float* const* r, const float* w, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
#pragma GCC unroll 8
    for (int j = 0; j < W; ++j) acc += w[c * W + j] * r[j][c];
    out[c] = acc;
  }
}

inline void TapsAnyWidth(float* out, const float* const* r, const float* w, int W, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
    for (int j = 0; j < W; ++j) acc += w[c * W + j] * r[j][c];
    out[c] = acc;
  }
}

}  // namespace

KIMI_CLONES void CausalConv1dSilu(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t T,
                                  int64_t C, const float* weight, int W, float* state) {
  const int64_t hist = W - 1;
  // window rows: [hist state rows][T input rows], so input t - (W-1) + j is row t + j.
  auto row = [&](int64_t r) -> const float* {
    return r < hist ? state + r * C : x + (r - hist) * ldx;
  };
  constexpr int kMaxTaps = 16;
  for (int64_t t = 0; t < T; ++t) {
    float* out = y + t * ldy;
    const float* r[kMaxTaps];
    const int taps = W < kMaxTaps ? W : kMaxTaps;
    for (int j = 0; j < taps; ++j) r[j] = row(t + j);
    if (W == 4) {  // every Kimi checkpoint (short_conv_kernel_size)
      Taps<4>(out, r, weight, C);
    } else if (W <= kMaxTaps) {
      TapsAnyWidth(out, r, weight, W, C);
    } else {
      for (int64_t c = 0; c < C; ++c) {
        float acc = 0.0f;
        for (int j = 0; j < W; ++j) acc += weight[c * W + j] * row(t + j)[c];
        out[c] = acc;
      }
    }
    MulSigmoid(out, out,
               C);  // SiLU, vectorised (a scalar expf per channel cost more than the conv)
  }
  // The window's last W-1 rows become the state, oldest first. Rows that were already in the state
  // move towards its start (each source row lies after its destination, so in order is safe).
  for (int64_t r = 0; r < hist; ++r) {
    const float* src = row(T + r);
    if (src != state + r * C) std::memmove(state + r * C, src, C * sizeof(float));
  }
}

}  // namespace kimi::cpu
