// Kimi Delta Attention layer (KIMI_LINEAR.md 3.1, KIMI_K3.md 5.3):
//   q,k,v = silu(causal_conv(x W^T)); q,k L2-normalised per head; beta = sigmoid(x W_b^T)
//   g     = decay gate of the low-rank f_b(f_a(x))
//   o     = KDA(q, k, v, g, beta) with the sequence's recurrent state
//   out   = o_proj( RMSNorm_head(o) * sigmoid(output gate) )
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/layers.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/side_prefetch.h"

namespace kimi::layers {
namespace {

// The states of a batched decode step's KDA layer are prefetched during its projections (see
// PrefetchStates) from this many tokens on: below it the projections read their weights at about
// the memory's speed themselves (batch 8: kimi-linear-small steps 1.007-1.010x the time, k3-mini
// level).
constexpr int64_t kPrefetchStatesMinTokens = 16;
// At most this many bytes of states a thread, so that two threads' states and the weights streamed
// meanwhile stay within L3 (32 MiB here) until the recurrence reads them: a batch-32 k3-mini step
// prefetches all of its 4.4 MB a thread, batch 64 (8.8 MB) and kimi-linear-small batch 32 / 64
// (8.4 / 16.8 MB) most or half of it; 4 and 16 MiB measured the same within the alternation's
// noise.
constexpr int64_t kPrefetchStatesMaxBytes = int64_t{8} << 20;

// Names the states (recurrent and conv, one range a layer) of the sequences of each thread's share
// of the side-by-side section (RunInShares) for thread p to prefetch while the layer's projections
// run (kernels/cpu/side_prefetch.h), in the order its share reads them. The recurrence reads and
// writes them at the memory's speed (k3-mini at batch 32: 8.8 MB a layer, its sections 0.42-0.60
// ms) while the projections before it are compute-bound and leave the memory idle. With them
// prefetched the sections took 0.30-0.34 ms; steps alternated every ten in one process (median of
// 8 per-pair ratios): k3-mini batch 32 0.96-0.99 of the time (0.98 the median of seven
// alternations), batch 64 0.99-1.00, kimi-linear-small batch 32 / 64 0.99-1.00. Prefetched during
// the previous layer's feed-forward sublayer instead (longer before the recurrence, behind more
// traffic), the states gained the sections 0.08-0.15 and cost the products more.
void PrefetchStates(const std::vector<const SeqSpan*>& seqs, int64_t shares, KdaStatePool& pool,
                    int64_t kda_index) {
  const int64_t count = static_cast<int64_t>(seqs.size());
  const int64_t layer_bytes = pool.LayerFloats() * static_cast<int64_t>(sizeof(float));
  const int64_t most = kPrefetchStatesMaxBytes / layer_bytes;  // sequences a thread
  std::vector<cpu::SideRanges> by_thread(shares);
  for (int64_t p = 0; p < shares; ++p) {
    const int64_t begin = cpu::ShareBegin(count, p, shares, 1);
    const int64_t end = std::min(cpu::ShareBegin(count, p + 1, shares, 1), begin + most);
    for (int64_t i = begin; i < end; ++i) {
      by_thread[p].push_back({pool.Layer(seqs[i]->kda_slot, kda_index), layer_bytes});
    }
  }
  cpu::SetSidePrefetch(by_thread);
}

}  // namespace

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
  // Short sequences (batched decode), when there are several, side by side: one per thread at a
  // time, its rows staying on that thread (as separate steps over every token, the conv, the gate,
  // the recurrence and the output norm moved each row between the cores: batch-8 / 32 k3-mini
  // steps took 1.02 / 1.025 times as long, kimi-linear-small ones level), each thread a contiguous
  // share of them, front to back, and then what is left of the others' from their backs
  // (RunInShares). With fixed halves one thread waited at the end of a batch-32 section for 44 us
  // (k3-mini, of 576) / 69 us (kimi-linear-small, of 979) on average; steps alternated every ten
  // in one process (median of 8 per-pair ratios), shares against halves: k3-mini batch 8 / 32 /
  // 64 0.998 / 0.994 / 0.976. The others (prefill) one after another, each kernel split over the
  // threads. A sequence's result is the same either way.
  std::vector<const SeqSpan*> side_by_side, one_by_one;
  for (const SeqSpan& s : layout.seqs) {
    (s.count <= kShortSequenceTokens ? side_by_side : one_by_one).push_back(&s);
  }
  if (side_by_side.size() < kMinSideBySide) {
    one_by_one.insert(one_by_one.end(), side_by_side.begin(), side_by_side.end());
    side_by_side.clear();
  }
  const int64_t count = static_cast<int64_t>(side_by_side.size());
  const int64_t shares = ShareCount(ThreadPool::Global());
  if (T >= kPrefetchStatesMinTokens && count > 0) {
    PrefetchStates(side_by_side, shares, pool, kda_index);
  }
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
  // The products over every token first: the decay gate's second low-rank factor and (Kimi
  // Linear) the output gate's.
  MatMul(g.get(), low.get(), w.f_b, T);
  if (!c.kda.full_rank_gate) MatMul(gate.get(), gate_low.get(), w.g_b, T);

  const auto qkv = Scratch(3 * T * P);  // after conv + SiLU
  float* q = qkv.get();
  float* k = q + T * P;
  float* v = k + T * P;
  const auto o = Scratch(T * P);
  const float* conv_w[3] = {w.q_conv, w.k_conv, w.v_conv};
  const float scale = 1.0f / std::sqrt(static_cast<float>(K));
  // Then everything else up to o_proj, one sequence at a time: the conv + SiLU of q, k and v, the
  // L2 norms, the decay gate and beta, the recurrence (one token) or the chunked form on the
  // absolute 64-token grid, and the output norm and gate. Each is a function of the sequence's own
  // rows, so a sequence's result does not depend on how the sequences are spread.
  const auto sequence = [&](const SeqSpan& s) {
    const int64_t a = s.offset * P, n = s.count;
    ParallelFor(3, 1, [&](int64_t begin, int64_t end) {
      float* conv_state = pool.Conv(s.kda_slot, kda_index);  // [3, W-1, P]
      for (int64_t i = begin; i < end; ++i) {
        CausalConv1dSilu(qkv.get() + i * T * P + a, P, proj.get() + i * T * P + a, P, n, P,
                         conv_w[i], W, conv_state + i * (W - 1) * P);
      }
    });
    L2Norm(q + a, n * H, K, 1e-6f);
    L2Norm(k + a, n * H, K, 1e-6f);
    KdaGate(g.get() + a, g.get() + a, n, H, K, w.a_log, w.dt_bias, c.kda.gate_lower_bound);
    SigmoidInPlace(beta.get() + s.offset * H, n * H);
    const KdaDims d{n, H, K, K};
    const float* b = beta.get() + s.offset * H;
    const auto recurrence = [&](auto* state) {  // float* or, with a bf16 state, uint16_t*
      if (n == 1) {
        KdaRecurrent(o.get() + a, q + a, k + a, v + a, g.get() + a, b, state, d, scale);
      } else {
        KdaChunk(o.get() + a, q + a, k + a, v + a, g.get() + a, b, state, d, scale, s.pos0);
      }
    };
    if (pool.state_dtype() == KdaStateDtype::kBf16) {
      recurrence(pool.RecurrentBf16(s.kda_slot, kda_index));
    } else {
      recurrence(pool.Recurrent(s.kda_slot, kda_index));
    }
    RmsNorm(o.get() + a, o.get() + a, w.o_norm, n * H, K, c.rms_eps);
    MulSigmoid(o.get() + a, gate.get() + a, n * P);
  };
  ClearSidePrefetch();
  if (count > 0) {
    RunInShares(ThreadPool::Global(), count, /*grain=*/1, /*tile=*/1,
                [&](int64_t begin, int64_t end) {
                  for (int64_t i = begin; i < end; ++i) sequence(*side_by_side[i]);
                });
  }
  for (const SeqSpan* s : one_by_one) sequence(*s);
  MatMul(out, o.get(), w.o_proj, T);
  return split.heads ? split.Reduce(out, T * c.hidden) : absl::OkStatus();
}

}  // namespace kimi::layers
