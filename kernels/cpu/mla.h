// Multi-head latent attention (DeepSeek-V2 style, NoPE) in the absorbed form, over a latent cache.
//
// The cache row of a position is [c_kv (rank) | k_pe (rope)], c_kv already RMS-normalised. For head h
// with W_UK_h = kv_b rows [h*(nope+v), +nope) and W_UV_h = the next v rows:
//     score_s = (q_nope_h^T W_UK_h c_s + q_pe_h . k_pe_s) * scale
//     o_h     = W_UV_h sum_s softmax(score)_s c_s
// which equals attention with k_h = [W_UK_h c_s | k_pe_s] and v_h = W_UV_h c_s.
#pragma once

#include <cstdint>

#include "kernels/paged.h"
#include "kernels/weight.h"

namespace kimi::cpu {

struct MlaDims {
  int64_t heads = 0;
  int64_t nope = 0;  // qk_nope_head_dim
  int64_t rope = 0;  // qk_rope_head_dim
  int64_t v = 0;     // v_head_dim
  int64_t rank = 0;  // kv_lora_rank
};

// q [T, heads, nope + rope], out [T, heads, v]. Query i is at position first_pos + i and attends
// causally to cache rows 0 .. first_pos + i, which must already hold the new tokens' rows.
// w_kv_b: [heads * (nope + v), rank].
void MlaAttention(float* out, const float* q, int64_t T, int64_t first_pos, const PagedRows& cache,
                  const Weight& w_kv_b, const MlaDims& d, float scale);

// The attention itself, in the latent space, for one sequence: qa [T, heads, rank + rope] holds
// the absorbed queries (W_UK_h^T q_nope | q_pe), out_lat [T, heads, rank] receives
// sum_s softmax(scale qa . cache_s) c_s. Keys are read in blocks shared by every head and query
// (they share the latent), with an online softmax; a row's result depends only on its query and
// the cache rows it sees.
void MlaLatentAttention(float* out_lat, const float* qa, int64_t T, int64_t first_pos,
                        const PagedRows& cache, int64_t heads, int64_t rank, int64_t rope,
                        float scale);

}  // namespace kimi::cpu
