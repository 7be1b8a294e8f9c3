#include "kernels/cpu/causal_conv.h"

#include <cstring>

#include "kernels/cpu/activation.h"

namespace kimi::cpu {

void CausalConv1dSilu(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t T, int64_t C,
                      const float* weight, int W, float* state) {
  const int64_t hist = W - 1;
  // window rows: [hist state rows][T input rows], so input t - (W-1) + j is row t + j.
  auto row = [&](int64_t r) -> const float* {
    return r < hist ? state + r * C : x + (r - hist) * ldx;
  };
  for (int64_t t = 0; t < T; ++t) {
    float* out = y + t * ldy;
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < W; ++j) acc += weight[c * W + j] * row(t + j)[c];
      out[c] = acc;
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
