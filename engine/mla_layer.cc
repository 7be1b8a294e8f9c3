// Multi-head latent attention layer, NoPE (KIMI_LINEAR.md 3.2, KIMI_K3.md 5.4):
//   q    = q_proj(x)  or  q_b(RMSNorm(q_a(x)))              [T, H, nope + rope]
//   c    = kv_a(x) = [c_kv | k_pe];  c_kv = RMSNorm(c_kv)    cached per position (paged)
//   o    = absorbed attention over the cache (kernels/cpu/mla.h), scale (nope + rope)^-1/2
//   out  = o_proj( o * sigmoid(g_proj(x)) )                  (gate only in K3)
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/layers.h"
#include "kernels/cpu/ops.h"

namespace kimi::layers {

void Mla(const ModelConfig& c, const MlaWeights& w, int64_t mla_index, const float* x, float* out,
         const StepLayout& layout, MlaKvCache& cache) {
  using namespace kimi::cpu;
  const MlaConfig& m = c.mla;
  const int64_t T = layout.tokens, H = m.num_heads, qk = m.qk_head_dim();
  const int64_t R = m.kv_lora_rank, width = m.cache_width();

  // Every projection of x in one pass: q (or q-LoRA's down projection), the cached latent, the
  // output gate.
  std::vector<float> q(T * H * qk), cq, latent(T * width), gate;
  {
    std::vector<MatMulTarget> targets = {{latent.data(), width, &w.kv_a_proj}};
    if (m.q_lora_rank > 0) {
      cq.resize(T * m.q_lora_rank);
      targets.push_back({cq.data(), m.q_lora_rank, &w.q_a_proj});
    } else {
      targets.push_back({q.data(), H * qk, &w.q_proj});
    }
    if (m.output_gate) {
      gate.resize(T * H * m.v_head_dim);
      targets.push_back({gate.data(), H * m.v_head_dim, &w.g_proj});
    }
    MatMulMany(targets, x, c.hidden, T);
  }
  if (m.q_lora_rank > 0) {
    RmsNorm(cq.data(), cq.data(), w.q_a_norm, T, m.q_lora_rank, m.norm_eps);
    MatMul(q.data(), cq.data(), w.q_b_proj, T);
  }
  for (int64_t t = 0; t < T; ++t) {  // k_pe is not normalised
    RmsNorm(&latent[t * width], &latent[t * width], w.kv_a_norm, 1, R, m.norm_eps);
  }

  std::vector<float> o(T * H * m.v_head_dim);
  const MlaDims dims{H, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, R};
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
  for (const SeqSpan& s : layout.seqs) {
    const PagedRows rows{cache.LayerPool(mla_index), s.pages.data(), cache.page_size(), width};
    for (int64_t i = 0; i < s.count; ++i) {
      const float* src = &latent[(s.offset + i) * width];
      std::copy(src, src + width, rows.Row(s.pos0 + i));
    }
    MlaAttention(o.data() + s.offset * H * m.v_head_dim, q.data() + s.offset * H * qk, s.count,
                 s.pos0, rows, w.kv_b_proj, dims, scale);
  }
  if (m.output_gate) MulSigmoid(o.data(), gate.data(), static_cast<int64_t>(o.size()));
  MatMul(out, o.data(), w.o_proj, T);
}

}  // namespace kimi::layers
