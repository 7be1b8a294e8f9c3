// Multi-head latent attention layer, NoPE (KIMI_LINEAR.md 3.2, KIMI_K3.md 5.4):
//   q    = q_proj(x)  or  q_b(RMSNorm(q_a(x)))              [T, H, nope + rope]
//   c    = kv_a(x) = [c_kv | k_pe];  c_kv = RMSNorm(c_kv)    cached per position (paged)
//   o    = absorbed attention over the cache (kernels/cpu/mla.h), scale (nope + rope)^-1/2
//   out  = o_proj( o * sigmoid(g_proj(x)) )                  (gate only in K3)
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "engine/layers.h"
#include "kernels/cpu/ops.h"

namespace kimi::layers {

absl::Status Mla(const ModelConfig& c, const MlaWeights& w, int64_t mla_index, const float* x,
                 float* out, const StepLayout& layout, MlaKvCache& cache, const Split& split) {
  using namespace kimi::cpu;
  const MlaConfig& m = c.mla;
  const int64_t T = layout.tokens, H = m.num_heads, qk = m.qk_head_dim();
  const int64_t R = m.kv_lora_rank, width = m.cache_width();

  // Every projection of x in one pass: q (or q-LoRA's down projection), the cached latent, the
  // output gate.
  const auto q = Scratch(T * H * qk), latent = Scratch(T * width);
  ScratchBuffer cq, gate;
  {
    std::vector<MatMulTarget> targets = {{latent.get(), width, &w.kv_a_proj}};
    if (m.q_lora_rank > 0) {
      cq = Scratch(T * m.q_lora_rank);
      targets.push_back({cq.get(), m.q_lora_rank, &w.q_a_proj});
    } else {
      targets.push_back({q.get(), H * qk, &w.q_proj});
    }
    if (m.output_gate) {
      gate = Scratch(T * H * m.v_head_dim);
      targets.push_back({gate.get(), H * m.v_head_dim, &w.g_proj});
    }
    MatMulMany(targets, x, c.hidden, T);
  }
  if (m.q_lora_rank > 0) {
    RmsNorm(cq.get(), cq.get(), w.q_a_norm, T, m.q_lora_rank, m.norm_eps);
    MatMul(q.get(), cq.get(), w.q_b_proj, T);
  }
  for (int64_t t = 0; t < T; ++t) {  // k_pe is not normalised
    RmsNorm(&latent[t * width], &latent[t * width], w.kv_a_norm, 1, R, m.norm_eps);
  }

  // The per-head products below are small (R x R weights): with few tokens each one is a single
  // thread's work, so the heads run side by side instead of one after another. With many tokens
  // every product is split over the threads itself. Results are the same either way.
  const bool by_head = 2 * T * m.qk_nope_head_dim * R < (int64_t{8} << 20);
  const auto per_head = [&](const std::function<void(int64_t)>& fn) {
    if (!by_head) {
      for (int64_t h = 0; h < H; ++h) fn(h);
      return;
    }
    ParallelFor(H, 1, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h) fn(h);
    });
  };

  // Absorbed queries qa [T, H, R + rope] = (W_UK_h^T q_nope | q_pe), one MatMul per head over
  // every token of the step.
  const int64_t wa = R + m.qk_rope_head_dim;
  const auto qa = Scratch(T * H * wa);
  per_head([&](int64_t h) {
    MatMul(qa.get() + h * wa, H * wa, q.get() + h * qk, H * qk, w.uk_t.Rows(h * R, R), T);
  });
  for (int64_t i = 0; i < T * H; ++i) {
    std::copy_n(&q[i * qk + m.qk_nope_head_dim], m.qk_rope_head_dim, &qa[i * wa + R]);
  }
  // Attention in the latent space, per sequence over its own pages.
  const auto o_lat = Scratch(T * H * R);
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
  const auto attend = [&](const SeqSpan& s) {
    const PagedRows rows{cache.LayerPool(mla_index), s.pages.data(), cache.page_size(), width};
    for (int64_t i = 0; i < s.count; ++i) {
      const float* src = &latent[(s.offset + i) * width];
      std::copy(src, src + width, rows.Row(s.pos0 + i));
    }
    MlaLatentAttention(o_lat.get() + s.offset * H * R, qa.get() + s.offset * H * wa, s.count,
                       s.pos0, rows, H, R, m.qk_rope_head_dim, scale);
  };
  // The sequences' attention: those with more work (rows times the keys each sees) than a thread's
  // fair share of the step's first, one at a time, each split over the threads (a prefill's rows,
  // a decode's keys); the others side by side, one a thread, handed out largest first as threads
  // free up. Batched decode used to give each thread a fixed half of its sequences, whatever their
  // contexts, and a step with any prefill in it split every sequence over the threads in turn.
  // Batch-32 k3-mini on the AMX host, steps alternated every ten in one process (median of 5
  // per-pair ratios) against those: one sequence at an 8192-token context among 31 at about 20,
  // 0.947 (42.3 against 44.6 ms); all at about 20, 0.998; a 512-token (128-token) prompt chunk
  // beside 31 decodes, 0.988 (0.983). A sequence's result is the same either way.
  const auto work = [&](const SeqSpan& s) { return s.count * (2 * s.pos0 + s.count + 1) / 2; };
  int64_t total = 0;
  for (const SeqSpan& s : layout.seqs) total += work(s);
  const int64_t fair = total / ThreadPool::Global().num_threads();
  std::vector<const SeqSpan*> side_by_side;
  for (const SeqSpan& s : layout.seqs) {
    if (work(s) > fair) {
      attend(s);
    } else {
      side_by_side.push_back(&s);
    }
  }
  std::stable_sort(side_by_side.begin(), side_by_side.end(),
                   [&](const SeqSpan* a, const SeqSpan* b) { return work(*a) > work(*b); });
  const auto attend_some = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) attend(*side_by_side[i]);
  };
  ThreadPool::Global().ParallelForChunks(static_cast<int64_t>(side_by_side.size()), 1, attend_some);
  // o_h = W_UV_h o_lat, one MatMul per head over every token.
  const auto o = Scratch(T * H * m.v_head_dim);
  per_head([&](int64_t h) {
    const int64_t row0 = h * (m.qk_nope_head_dim + m.v_head_dim) + m.qk_nope_head_dim;
    MatMul(o.get() + h * m.v_head_dim, H * m.v_head_dim, o_lat.get() + h * R, H * R,
           w.kv_b_proj.Rows(row0, m.v_head_dim), T);
  });
  if (m.output_gate) MulSigmoid(o.get(), gate.get(), T * H * m.v_head_dim);
  MatMul(out, o.get(), w.o_proj, T);
  return split.heads ? split.Reduce(out, T * c.hidden) : absl::OkStatus();
}

}  // namespace kimi::layers
