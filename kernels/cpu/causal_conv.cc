#include "kernels/cpu/causal_conv.h"

#include <vector>

#include "kernels/cpu/activation.h"

namespace kimi::cpu {

void CausalConv1dSilu(float* y, int64_t ldy, const float* x, int64_t ldx, int64_t T, int64_t C,
                      const float* weight, int W, float* state) {
  const int64_t hist = W - 1;
  // window rows: [hist state rows][T input rows], so input t - (W-1) + j is row t + j.
  auto row = [&](int64_t r) -> const float* {
    return r < hist ? state + r * C : x + (r - hist) * ldx;
  };
  std::vector<float> out(C);
  std::vector<float> new_state(hist * C);
  for (int64_t r = 0; r < hist; ++r) {  // the last W-1 rows of the window become the new state
    const float* src = row(T + r);
    std::copy(src, src + C, new_state.begin() + r * C);
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < W; ++j) acc += weight[c * W + j] * row(t + j)[c];
      out[c] = acc * Sigmoid(acc);
    }
    std::copy(out.begin(), out.end(), y + t * ldy);
  }
  std::copy(new_state.begin(), new_state.end(), state);
}

}  // namespace kimi::cpu
