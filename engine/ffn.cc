// Feed-forward sublayers: the gated dense MLP and the mixture of experts (KIMI_LINEAR.md 3.3-3.4,
// KIMI_K3.md 5.2, 5.5).
#include <algorithm>
#include <memory>
#include <vector>

#include "engine/expert_jobs.h"
#include "engine/expert_placement.h"
#include "engine/layers.h"
#include "kernels/cpu/ops.h"

namespace kimi::layers {

void GatedActivation(const ModelConfig& c, float* gate, const float* up, int64_t n) {
  using namespace kimi::cpu;
  if (c.activation == Activation::kSituGlu) {
    SituGlu(gate, gate, up, n, c.situ_beta, c.situ_linear_beta);
  } else {
    SiluGlu(gate, gate, up, n);
  }
}

void GatedMlpDown(const ModelConfig& c, const MlpWeights& w, float* gate, const float* up,
                  float* out, int64_t rows) {
  GatedActivation(c, gate, up, rows * w.gate.rows);
  cpu::MatMul(out, gate, w.down, rows);
}

void GatedMlp(const ModelConfig& c, const MlpWeights& w, const float* x, float* out, int64_t rows) {
  using namespace kimi::cpu;
  const int64_t I = w.gate.rows;
  const auto gate = Scratch(rows * I), up = Scratch(rows * I);
  const MatMulTarget targets[] = {{gate.get(), I, &w.gate}, {up.get(), I, &w.up}};
  MatMulMany(targets, x, w.gate.cols, rows);
  GatedMlpDown(c, w, gate.get(), up.get(), out, rows);
}

// Router on the full hidden x; routed experts on x (Kimi Linear) or on its latent projection
// (K3), combined, latent-normalised and projected up; shared experts on x, unscaled.
//
// Each expert runs once over all tokens routed to it, so its weights are read once per step. A
// token's expert outputs are added in ascending expert id, an order set by the token's own
// routing: results do not depend on the rest of the batch or on which thread ran which expert.
//
// Split over ranks (routed experts by owner, or each expert's columns), every rank adds the
// experts it holds, and the routed sum is reduced before the latent RMSNorm (a norm of partial
// sums is not the norm of the sum). Shared experts are split like dense MLPs under tp alone and
// replicated when experts are parallel.
absl::Status Moe(const ModelConfig& c, const MoeWeights& w, const float* x, float* out,
                 int64_t rows, const Split& split, MoeLayerStats* stats) {
  using namespace kimi::cpu;
  const MoeConfig& m = c.moe;
  const int64_t T = rows, E = m.num_experts, k = m.top_k, D = c.ExpertDim(), d = c.hidden;

  // The shared experts, from kSharedJobTokens tokens on, are a job of their own beside the
  // routed experts (gate, up and down on one thread, its rows staying there). With their gate
  // and up in the pass over x below and the down projection alone a job, steps alternated every
  // ten in one process (median of 4-8 per-pair ratios) took 1.012-1.021 times as long at
  // batch-64 k3-mini, 0.999-1.010 at batch 8 and 0.996-1.005 at batch 32; kimi-linear-small batch
  // 8 / 32 / 64 0.994-1.003 / 1.003-1.004 / 1.004-1.016. With fewer tokens (decode of one to three
  // sequences) a job of every product would be the largest by far and run split, in sections of
  // its own: there the gate and up join the pass over x, where each is a few microseconds of work.
  constexpr int64_t kSharedJobTokens = 4;
  const bool shared_job = w.shared.gate.data && T >= kSharedJobTokens;

  // Every product of x in one pass (fewer, larger parallel sections): the router, the latent down
  // projection, and below kSharedJobTokens tokens the shared experts' gate and up.
  const auto logits = Scratch(T * E);
  ScratchBuffer latent, shared_gate, shared_up;
  {
    std::vector<MatMulTarget> targets = {{logits.get(), E, &w.router}};
    if (m.latent_dim > 0) {
      latent = Scratch(T * D);
      targets.push_back({latent.get(), D, &w.latent_down});
    }
    if (w.shared.gate.data && !shared_job) {
      const int64_t I = w.shared.gate.rows;
      shared_gate = Scratch(T * I);
      shared_up = Scratch(T * I);
      targets.push_back({shared_gate.get(), I, &w.shared.gate});
      targets.push_back({shared_up.get(), I, &w.shared.up});
    }
    MatMulMany(targets, x, d, T);
  }
  std::vector<int32_t> ids(T * k);
  std::vector<float> weights(T * k);
  const MoeRouteParams route{E, k, m.num_groups, m.topk_groups, m.renormalize, m.routed_scaling};
  MoeRoute(ids.data(), weights.data(), logits.get(), w.bias, T, route);

  const float* z = m.latent_dim > 0 ? latent.get() : x;
  // Which rank computes each routed pair (all here unless experts are parallel).
  const bool ep = split.expert_ranks > 1;
  const ExpertPlacement place = PlaceExperts(ids, E, ep ? split.expert_ranks : 1,
                                             split.replicate_threshold, split.max_replicas);
  if (stats) {
    const int64_t busiest = *std::max_element(place.expert_load.begin(), place.expert_load.end());
    stats->tokens = T;
    stats->expert_imbalance =
        T > 0 ? static_cast<double>(busiest) * static_cast<double>(E) / static_cast<double>(T * k)
              : 1.0;
    stats->rank_imbalance = place.rank_imbalance;
    stats->balanced_imbalance = place.balanced_imbalance;
    stats->replicated = place.replicated;
  }
  // This rank's pairs grouped by expert, in token order (a counting sort): routing pair i's rows
  // are row slot[i] of `in` and `res` (-1: computed on another rank, or its expert not bound
  // here), expert e's are rows [first[e], first[e + 1]), and token_of names each row's token. Each
  // job gathers its rows itself, side by side with the others.
  const auto mine = [&](int64_t i) {
    return (!ep || place.rank_of_pair[i] == split.expert_rank) && w.experts[ids[i]].gate.data;
  };
  std::vector<int64_t> first(E + 1, 0), slot(T * k, -1), token_of(T * k);
  for (int64_t i = 0; i < T * k; ++i) first[ids[i] + 1] += mine(i) ? 1 : 0;
  for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
  {
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < T * k; ++i) {
      if (!mine(i)) continue;
      slot[i] = next[ids[i]]++;
      token_of[slot[i]] = i / k;
    }
  }
  const auto in = Scratch(first[E] * D), res = Scratch(first[E] * D);
  std::vector<ExpertJob> jobs;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = first[e + 1] - first[e];
    if (n == 0) continue;
    ExpertJob job{&w.experts[e], &in[first[e] * D], &res[first[e] * D], n,
                  JobCost(w.experts[e], n)};
    job.src = z;
    job.rows = &token_of[first[e]];
    job.width = D;
    jobs.push_back(job);
  }
  ScratchBuffer shared;
  if (w.shared.gate.data) {
    shared = Scratch(T * d);
    ExpertJob job{&w.shared, nullptr, shared.get(), T,
                  JobCost(w.shared, T, /*down_only=*/!shared_job)};
    if (shared_job) {
      job.src = x;
    } else {
      job.gate = shared_gate.get();
      job.up = shared_up.get();
    }
    jobs.push_back(job);
  }
  RunExpertJobs(c, jobs);

  // Token t's routing pairs in ascending expert id, the order its expert outputs are added in: it
  // depends on the token alone.
  const auto by_expert = [&](int64_t t, std::vector<int64_t>& order) {
    for (int64_t j = 0; j < k; ++j) order[j] = t * k + j;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  };
  std::vector<float> y(T * D, 0.0f);
  if (!ep) {
    // Tokens in parallel, each summed by one thread.
    cpu::ParallelFor(T, 4, [&](int64_t t0, int64_t t1) {
      std::vector<int64_t> order(k);
      for (int64_t t = t0; t < t1; ++t) {
        by_expert(t, order);
        float* yt = &y[t * D];
        for (int64_t i : order) {
          if (slot[i] < 0) continue;
          const float wt = weights[i];
          const float* r = &res[slot[i] * D];
          for (int64_t j = 0; j < D; ++j) yt[j] += wt * r[j];
        }
      }
    });
  } else {
    // Expert parallel: every pair's weighted output lands in its own slot on the rank that made
    // it (zeros elsewhere), the slots are summed over the ranks (exact: one non-zero per slot),
    // and each token adds its slots in ascending expert id, as one process does.
    std::vector<float> slots(T * k * D, 0.0f);
    for (int64_t i = 0; i < T * k; ++i) {
      if (slot[i] < 0) continue;
      const float wt = weights[i];
      const float* r = &res[slot[i] * D];
      float* out_slot = &slots[i * D];
      for (int64_t j = 0; j < D; ++j) out_slot[j] = wt * r[j];
    }
    if (absl::Status s = split.Reduce(slots.data(), T * k * D); !s.ok()) return s;
    std::vector<int64_t> order(k);
    for (int64_t t = 0; t < T; ++t) {
      by_expert(t, order);
      float* yt = &y[t * D];
      for (int64_t pair : order) {
        const float* slot = &slots[pair * D];
        for (int64_t j = 0; j < D; ++j) yt[j] += slot[j];
      }
    }
  }
  // With shared experts split like the routed ones and no latent, one reduction covers both.
  const bool fold_shared = split.shared && m.latent_dim == 0 && shared != nullptr;
  if (fold_shared) {
    for (int64_t i = 0; i < T * d; ++i) y[i] += shared[i];
  }
  if (split.experts && !ep) {  // column-split experts: partial sums
    if (absl::Status s = split.Reduce(y.data(), T * D); !s.ok()) return s;
  }
  if (m.latent_dim > 0) {
    if (m.latent_norm) RmsNorm(y.data(), y.data(), w.latent_norm, T, D, c.rms_eps);
    MatMul(out, y.data(), w.latent_up, T);
  } else {
    std::copy(y.begin(), y.end(), out);
  }
  if (shared && !fold_shared) {
    if (split.shared) {
      if (absl::Status s = split.Reduce(shared.get(), T * d); !s.ok()) return s;
    }
    for (int64_t i = 0; i < T * d; ++i) out[i] += shared[i];
  }
  return absl::OkStatus();
}

}  // namespace kimi::layers
