// Feed-forward sublayers: the gated dense MLP and the mixture of experts (KIMI_LINEAR.md 3.3-3.4,
// KIMI_K3.md 5.2, 5.5).
#include <algorithm>
#include <vector>

#include "engine/layers.h"
#include "kernels/cpu/ops.h"

namespace kimi::layers {

void GatedMlp(const ModelConfig& c, const MlpWeights& w, const float* x, float* out,
              int64_t rows) {
  using namespace kimi::cpu;
  const int64_t I = w.gate.rows;
  std::vector<float> gate(rows * I), up(rows * I);
  MatMul(gate.data(), x, w.gate, rows);
  MatMul(up.data(), x, w.up, rows);
  if (c.activation == Activation::kSituGlu) {
    SituGlu(gate.data(), gate.data(), up.data(), rows * I, c.situ_beta, c.situ_linear_beta);
  } else {
    SiluGlu(gate.data(), gate.data(), up.data(), rows * I);
  }
  MatMul(out, gate.data(), w.down, rows);
}

// Router on the full hidden x; routed experts on x (Kimi Linear) or on its latent projection
// (K3), combined, latent-normalised and projected up; shared experts on x, unscaled.
//
// Each expert runs once over all tokens routed to it, so its weights are read once per step. A
// token's expert outputs are added in ascending expert id, an order set by the token's own
// routing: results do not depend on the rest of the batch.
//
// Split over ranks (routed experts by owner, or each expert's columns), every rank adds the
// experts it holds, and the routed sum is reduced before the latent RMSNorm (a norm of partial
// sums is not the norm of the sum). Shared experts are split like dense MLPs under tp alone and
// replicated when experts are parallel.
absl::Status Moe(const ModelConfig& c, const MoeWeights& w, const float* x, float* out,
                 int64_t rows, const Split& split) {
  using namespace kimi::cpu;
  const MoeConfig& m = c.moe;
  const int64_t T = rows, E = m.num_experts, k = m.top_k, D = c.ExpertDim();

  std::vector<float> logits(T * E);
  MatMul(logits.data(), x, w.router, T);
  std::vector<int32_t> ids(T * k);
  std::vector<float> weights(T * k);
  const MoeRouteParams route{E, k, m.num_groups, m.topk_groups, m.renormalize, m.routed_scaling};
  MoeRoute(ids.data(), weights.data(), logits.data(), w.bias, T, route);

  std::vector<float> latent;
  const float* z = x;
  if (m.latent_dim > 0) {
    latent.resize(T * D);
    MatMul(latent.data(), x, w.latent_down, T);
    z = latent.data();
  }
  // Tokens per expert, in token order.
  std::vector<std::vector<std::pair<int32_t, float>>> routed(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) routed[ids[t * k + j]].emplace_back(t, weights[t * k + j]);
  }
  std::vector<float> y(T * D, 0.0f), in, res;
  for (int64_t e = 0; e < E; ++e) {
    const auto& list = routed[e];
    if (list.empty() || !w.experts[e].gate.data) continue;  // none routed, or another rank's
    const int64_t n = static_cast<int64_t>(list.size());
    in.resize(n * D);
    res.resize(n * D);
    for (int64_t i = 0; i < n; ++i) std::copy_n(z + list[i].first * D, D, &in[i * D]);
    GatedMlp(c, w.experts[e], in.data(), res.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      float* yt = &y[list[i].first * D];
      const float wt = list[i].second;
      for (int64_t d = 0; d < D; ++d) yt[d] += wt * res[i * D + d];
    }
  }
  const int64_t d = c.hidden;
  std::vector<float> shared;
  if (w.shared.gate.data) {
    shared.resize(T * d);
    GatedMlp(c, w.shared, x, shared.data(), T);
  }
  // With shared experts split like the routed ones and no latent, one reduction covers both.
  const bool fold_shared = split.shared && m.latent_dim == 0 && !shared.empty();
  if (fold_shared) {
    for (int64_t i = 0; i < T * d; ++i) y[i] += shared[i];
  }
  if (split.experts) {
    if (absl::Status s = split.Reduce(y.data(), T * D); !s.ok()) return s;
  }
  if (m.latent_dim > 0) {
    if (m.latent_norm) RmsNorm(y.data(), y.data(), w.latent_norm, T, D, c.rms_eps);
    MatMul(out, y.data(), w.latent_up, T);
  } else {
    std::copy(y.begin(), y.end(), out);
  }
  if (!shared.empty() && !fold_shared) {
    if (split.shared) {
      if (absl::Status s = split.Reduce(shared.data(), T * d); !s.ok()) return s;
    }
    for (int64_t i = 0; i < T * d; ++i) out[i] += shared[i];
  }
  return absl::OkStatus();
}

}  // namespace kimi::layers
