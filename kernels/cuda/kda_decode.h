// Fused KDA decode: one kernel does a decode token's whole KDA core for one head of one sequence,
// updating the sequence's state slot in place:
//   conv + SiLU of q, k, v (history in the slot)  ->  L2 norm of q, k; q *= scale
//   g = decay gate(g_raw + dt_bias), beta = sigmoid(beta_raw)
//   S = diag(exp g) S;  S += k (beta (v - S^T k))^T;  o = S^T q          (fp32 state)
//   o = RMSNorm(o) * o_norm * sigmoid(gate)                              (fla FusedRMSNormGated)
// It handles the sequences of the step that have exactly one token (others are left to the
// chunked path); a padding sequence (slot -1) writes zeros and touches no state. The result
// equals KdaRecurrent (kernels/cpu/kda.h) after the CPU's separate steps, in fp32.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/batch.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

constexpr int64_t kKdaMaxHeadDim = 256;

struct KdaDecodeArgs {
  float* o = nullptr;  // [T, H * V], rows of the decode tokens written
  // A slot's state starts at state + slot * slot_stride: recurrent [H, K, V] (fp32), then at
  // conv_offset the conv history [3 (q, k, v), W-1, H * K].
  float* state = nullptr;
  int64_t slot_stride = 0;
  int64_t conv_offset = 0;
  const float* q_raw = nullptr;  // projections before the conv, [T, H * K] each, row stride ld_qkv
  const float* k_raw = nullptr;
  const float* v_raw = nullptr;
  int64_t ld_qkv = 0;
  const float* g_raw = nullptr;     // [T, H * K] low-rank decay gate output
  const float* beta_raw = nullptr;  // [T, H] before the sigmoid
  const float* gate = nullptr;      // [T, H * V] output gate before the sigmoid
  const float* conv_q = nullptr;    // [H * K, W] each
  const float* conv_k = nullptr;
  const float* conv_v = nullptr;
  const float* a_log = nullptr;    // [H]
  const float* dt_bias = nullptr;  // [H * K]
  const float* o_norm = nullptr;   // [V]
  bool has_lower_bound = false;  // K3's bounded gate (lower_bound), else Kimi Linear's softplus
  float lower_bound = 0.0f;
  int64_t H = 0, K = 0, V = 0;  // K == V (the state pool's conv history assumes it)
  int W = 4;
  float scale = 1.0f;
  float l2_eps = 1e-6f;
  float norm_eps = 1e-5f;
};

absl::Status KdaDecode(const KdaDecodeArgs& args, const DeviceBatch& batch, cudaStream_t stream);

}  // namespace kimi::cuda
