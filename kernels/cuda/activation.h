// Elementwise activations on the GPU (kernels/cpu/activation.h on the device). Device pointers,
// fp32 math; in place allowed (out may alias gate or x).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

// SiLU-GLU (Kimi Linear): out = silu(gate) * up over n values.
absl::Status SiluGlu(float* out, const float* gate, const float* up, int64_t n, cudaStream_t stream);

// SiTU-GLU (Kimi K3): out = beta*tanh(gate/beta)*sigmoid(gate) * linear_beta*tanh(up/linear_beta).
absl::Status SituGlu(float* out, const float* gate, const float* up, int64_t n, float beta,
                     float linear_beta, cudaStream_t stream);

// out = sigmoid(x).
absl::Status Sigmoid(float* out, const float* x, int64_t n, cudaStream_t stream);

// x *= sigmoid(gate) (output gates).
absl::Status MulSigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);

}  // namespace kimi::cuda
