// Block Attention Residuals (Kimi K3): a softmax over depth that mixes the closed block rows and the
// current partial sum of one token into the input of the next sublayer.
//
// For token t with rows v_0..v_{nb-1} (the bank) and v_nb (the partial sum):
//     s_j = (v_j . w) / sqrt(mean(v_j^2) + eps),   w = res_norm.weight * res_proj.weight
//     out = sum_j softmax(s)_j v_j                 (raw rows, not normalised)
// All in fp32.
#pragma once

#include <cstdint>

namespace kimi::cpu {

// bank: token t's row j at bank + t * bank_stride + j * H. partial, out: [T, H] (out may not alias).
// w: [H] (the folded pseudo-query). probs: [T, nb + 1] or null.
void AttnRes(float* out, float* probs, const float* bank, int64_t bank_stride, int64_t nb,
             const float* partial, const float* w, int64_t T, int64_t H, float eps);

}  // namespace kimi::cpu
