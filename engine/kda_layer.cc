// Kimi Delta Attention layer (KIMI_LINEAR.md 3.1, KIMI_K3.md 5.3):
//   q,k,v = silu(causal_conv(x W^T)); q,k L2-normalised per head; beta = sigmoid(x W_b^T)
//   g     = decay gate of the low-rank f_b(f_a(x))
//   o     = KDA(q, k, v, g, beta) with the sequence's recurrent state
//   out   = o_proj( RMSNorm_head(o) * sigmoid(output gate) )
#include <cmath>
#include <vector>

#include "engine/layers.h"
#include "kernels/cpu/ops.h"

namespace kimi::layers {

absl::Status Kda(const ModelConfig& c, const KdaWeights& w, int64_t kda_index, const float* x,
                 float* out, const StepLayout& layout, KdaStatePool& pool, const Split& split) {
  using namespace kimi::cpu;
  const int64_t T = layout.tokens;
  const int64_t H = c.kda.num_heads, K = c.kda.head_dim, P = c.kda.projection();
  const int W = static_cast<int>(c.kda.conv_kernel);

  // Every projection of x in one pass: q, k, v (before the conv), the decay gate's low rank, beta,
  // and the output gate (full rank, or its low rank).
  const auto proj = Scratch(3 * T * P);  // [3][T, P]
  const auto low = Scratch(T * w.f_a.rows), g = Scratch(T * P), beta = Scratch(T * H);
  const auto gate = Scratch(T * P);
  ScratchBuffer gate_low;
  {
    const int64_t d = c.hidden;
    std::vector<MatMulTarget> targets = {{proj.get(), P, &w.q_proj},
                                         {proj.get() + T * P, P, &w.k_proj},
                                         {proj.get() + 2 * T * P, P, &w.v_proj},
                                         {low.get(), w.f_a.rows, &w.f_a},
                                         {beta.get(), H, &w.b_proj}};
    if (c.kda.full_rank_gate) {
      targets.push_back({gate.get(), P, &w.g_proj});
    } else {
      gate_low = Scratch(T * w.g_a.rows);
      targets.push_back({gate_low.get(), w.g_a.rows, &w.g_a});
    }
    MatMulMany(targets, x, d, T);
  }
  const auto qkv = Scratch(3 * T * P);  // after conv + SiLU
  const float* conv_w[3] = {w.q_conv, w.k_conv, w.v_conv};
  // Each (sequence, q / k / v) convolution is independent: spread over the threads (at batched
  // decode, 3 per sequence of one token each; serial, they were about 6% of the calling thread's
  // time in a batch-8 step on k3-mini).
  ParallelFor(static_cast<int64_t>(layout.seqs.size()) * 3, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const SeqSpan& s = layout.seqs[item / 3];
      const int64_t i = item % 3;
      float* conv_state = pool.Conv(s.kda_slot, kda_index);  // [3, W-1, P]
      CausalConv1dSilu(qkv.get() + i * T * P + s.offset * P, P,
                       proj.get() + i * T * P + s.offset * P, P, s.count, P, conv_w[i], W,
                       conv_state + i * (W - 1) * P);
    }
  });
  float* q = qkv.get();
  float* k = q + T * P;
  float* v = k + T * P;
  L2Norm(q, T * H, K, 1e-6f);
  L2Norm(k, T * H, K, 1e-6f);

  // Decay gate (fp32) and beta.
  MatMul(g.get(), low.get(), w.f_b, T);
  KdaGate(g.get(), g.get(), T, H, K, w.a_log, w.dt_bias, c.kda.gate_lower_bound);
  SigmoidInPlace(beta.get(), T * H);

  const auto o = Scratch(T * P);
  const float scale = 1.0f / std::sqrt(static_cast<float>(K));
  const auto attend = [&](const SeqSpan& s) {
    const KdaDims d{s.count, H, K, K};
    const int64_t a = s.offset * P;
    float* state = pool.Recurrent(s.kda_slot, kda_index);
    // One token: the recurrence. More: the chunked form on the absolute 64-token grid.
    if (s.count == 1) {
      KdaRecurrent(o.get() + a, q + a, k + a, v + a, g.get() + a, beta.get() + s.offset * H, state,
                   d, scale);
    } else {
      KdaChunk(o.get() + a, q + a, k + a, v + a, g.get() + a, beta.get() + s.offset * H, state, d,
               scale, s.pos0);
    }
  };
  // Many short sequences (batched decode): one sequence per thread at a time; otherwise each
  // sequence's heads are split over the threads. A sequence's result is the same either way.
  if (ManyShortSequences(layout)) {
    ParallelFor(static_cast<int64_t>(layout.seqs.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) attend(layout.seqs[i]);
    });
  } else {
    for (const SeqSpan& s : layout.seqs) attend(s);
  }

  // Output gate: low rank (Kimi Linear) or full rank (K3).
  if (!c.kda.full_rank_gate) MatMul(gate.get(), gate_low.get(), w.g_b, T);
  RmsNorm(o.get(), o.get(), w.o_norm, T * H, K, c.rms_eps);
  MulSigmoid(o.get(), gate.get(), T * P);
  MatMul(out, o.get(), w.o_proj, T);
  return split.heads ? split.Reduce(out, T * c.hidden) : absl::OkStatus();
}

}  // namespace kimi::layers
