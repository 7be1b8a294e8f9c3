// Gated activations of the FFNs (out = act(gate) * up) and the gates' elementwise functions, over n
// values (in place allowed). Vectorised with the instruction set MatMul uses
// (kernels/cpu/matmul.h); an element's result does not depend on its position in the buffer.
#pragma once

#include <cstdint>

namespace kimi::cpu {

// SiLU-GLU (Kimi Linear): silu(gate) * up.
void SiluGlu(float* out, const float* gate, const float* up, int64_t n);

// SiTU-GLU (Kimi K3): beta*tanh(gate/beta)*sigmoid(gate) * linear_beta*tanh(up/linear_beta).
void SituGlu(float* out, const float* gate, const float* up, int64_t n, float beta,
             float linear_beta);

// x = sigmoid(x), and x *= sigmoid(gate) (output gates), elementwise over n values.
void SigmoidInPlace(float* x, int64_t n);
void MulSigmoid(float* x, const float* gate, int64_t n);

// x = softplus(x) = log(1 + exp(x)), x itself above 20 (torch's threshold), elementwise.
void SoftplusInPlace(float* x, int64_t n);

// Strided forms for a [rows, 2*width] buffer holding [gate | up] per row; out [rows, width].
void SiluGluRows(float* out, const float* gate_up, int64_t rows, int64_t width);
void SituGluRows(float* out, const float* gate_up, int64_t rows, int64_t width, float beta,
                 float linear_beta);

inline float Sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

}  // namespace kimi::cpu
