#include "kernels/cpu/causal_conv.h"

#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/target_clones.h"

namespace kimi::cpu {
namespace {

// out[c] = sum_j w[c, j] * r[j][c], taps added in order j = 0 .. W-1. With W known at compile
// time the compiler vectorises over channels (the stride-W weight loads become shuffles).
template <int W>
KIMI_INLINE void Taps(float* out, const float* const (&r)[W], const float* w, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    float acc = 0.0f;
#pragma GCC unroll 8
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
  for (int64_t t = 0; t < T; ++t) {
    float* out = y + t * ldy;
    if (W == 4) {  // every Kimi checkpoint (short_conv_kernel_size)
      const float* const r[4] = {row(t), row(t + 1), row(t + 2), row(t + 3)};
      Taps<4>(out, r, weight, C);
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
