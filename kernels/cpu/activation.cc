#include "kernels/cpu/activation.h"

#include <cmath>

namespace kimi::cpu {

void SiluGlu(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

void SituGlu(float* out, const float* gate, const float* up, int64_t n, float beta,
             float linear_beta) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = beta * std::tanh(gate[i] / beta) * Sigmoid(gate[i]);
    const float u = linear_beta * std::tanh(up[i] / linear_beta);
    out[i] = a * u;
  }
}

void SiluGluRows(float* out, const float* gate_up, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    SiluGlu(out + r * width, gate_up + r * 2 * width, gate_up + r * 2 * width + width, width);
  }
}

void SituGluRows(float* out, const float* gate_up, int64_t rows, int64_t width, float beta,
                 float linear_beta) {
  for (int64_t r = 0; r < rows; ++r) {
    SituGlu(out + r * width, gate_up + r * 2 * width, gate_up + r * 2 * width + width, width, beta,
            linear_beta);
  }
}

}  // namespace kimi::cpu
