// Kimi Delta Attention: the gated delta rule with a per-channel ("fine-grained") decay.
//
// Per head, with state S [K, V] (fp32), for each token t (q and k already L2-normalised):
//     S   = diag(exp(g_t)) S
//     S  += k_t (beta_t (v_t - S^T k_t))^T
//     o_t = S^T (scale q_t)
// KdaRecurrent runs this literally. KdaChunk computes the same thing 64 tokens at a time in the
// WY/UT form (see kda.cc), which turns most of the work into small matrix products.
#pragma once

#include <cstdint>
#include <optional>

namespace kimi::cpu {

struct KdaDims {
  int64_t T = 0;  // tokens of one sequence
  int64_t H = 0;  // heads
  int64_t K = 0;  // key (and decay) width per head
  int64_t V = 0;  // value width per head
};

// Tensors are token-major: q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; o [T, H, V].
// state [H, K, V] is read as the initial state and overwritten with the final one.
void KdaRecurrent(float* o, const float* q, const float* k, const float* v, const float* g,
                  const float* beta, float* state, const KdaDims& d, float scale);

// Same contract. Chunks sit on the absolute grid of `chunk` tokens: with `pos0` tokens already in
// the state, the first chunk ends at the next multiple of `chunk`, so splitting a prompt at
// multiples of `chunk` gives bit-identical results to running it whole. A chunk of one token is
// KdaRecurrent's step, so a split that leaves the last token alone (run by KdaRecurrent) does too.
void KdaChunk(float* o, const float* q, const float* k, const float* v, const float* g,
              const float* beta, float* state, const KdaDims& d, float scale, int64_t pos0 = 0,
              int chunk = 64);

// The same two forms with the state stored as bf16 between calls (an opt-in of the state pool:
// half the memory and the traffic of fp32). Each head's state is widened to fp32 exactly, stepped
// as above, and rounded to bf16 after every token of KdaRecurrent and after every chunk of KdaChunk
// (nearest even; an fp32 subnormal becomes the zero of its sign and a NaN a quiet NaN, as AVX-512
// BF16's VCVTNEPS2BF16 gives); a token's output takes the unrounded state. Rounding on the grid
// keeps both contracts above: splits at multiples of `chunk` and a one-token tail give the whole
// run's bits.
void KdaRecurrent(float* o, const float* q, const float* k, const float* v, const float* g,
                  const float* beta, uint16_t* state, const KdaDims& d, float scale);
void KdaChunk(float* o, const float* q, const float* k, const float* v, const float* g,
              const float* beta, uint16_t* state, const KdaDims& d, float scale, int64_t pos0 = 0,
              int chunk = 64);

// Log-space decay per channel from the low-rank gate output g_raw [T, H, K] (in place allowed):
//   no lower bound (Kimi Linear): g = -exp(A_log[h]) * softplus(g_raw + dt_bias)   (threshold 20)
//   lower bound lb (Kimi K3):     g = lb * sigmoid(exp(A_log[h]) * (g_raw + dt_bias))
// dt_bias is [H * K], a_log [H].
void KdaGate(float* g, const float* g_raw, int64_t T, int64_t H, int64_t K, const float* a_log,
             const float* dt_bias, std::optional<float> lower_bound);

}  // namespace kimi::cpu
