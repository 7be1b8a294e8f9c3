// Gated activations of the FFNs: out = act(gate) * up, elementwise over n values.
#pragma once

#include <cstdint>

namespace kimi::cpu {

// SiLU-GLU (Kimi Linear): silu(gate) * up.
void SiluGlu(float* out, const float* gate, const float* up, int64_t n);

// SiTU-GLU (Kimi K3): beta*tanh(gate/beta)*sigmoid(gate) * linear_beta*tanh(up/linear_beta).
void SituGlu(float* out, const float* gate, const float* up, int64_t n, float beta,
             float linear_beta);

// Strided forms for a [rows, 2*width] buffer holding [gate | up] per row; out [rows, width].
void SiluGluRows(float* out, const float* gate_up, int64_t rows, int64_t width);
void SituGluRows(float* out, const float* gate_up, int64_t rows, int64_t width, float beta,
                 float linear_beta);

inline float Sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

}  // namespace kimi::cpu
