#include "engine/parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kimi {

absl::Status ValidateLayout(const ModelConfig& c, const ParallelLayout& p) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (p.tp < 1 || p.ep < 1 || p.pp < 1) return bad("parallel: tp, ep and pp must be >= 1");
  const int g = p.group();
  if ((p.tp != 1 && p.tp != g) || (p.ep != 1 && p.ep != g)) {
    return bad(absl::StrCat("parallel: tp (", p.tp, ") and ep (", p.ep,
                            ") must each be 1 or the stage size max(tp, ep) = ", g));
  }
  if (p.pp > c.num_layers) {
    return bad(absl::StrCat("parallel.pp: ", p.pp, " stages for ", c.num_layers, " layers"));
  }
  if (!p.stage_layers.empty()) {
    int64_t sum = 0;
    for (int64_t n : p.stage_layers) {
      if (n < 1) return bad("parallel.stage_layers: every stage needs at least one layer");
      sum += n;
    }
    if (static_cast<int>(p.stage_layers.size()) != p.pp || sum != c.num_layers) {
      return bad(absl::StrCat("parallel.stage_layers: ", p.stage_layers.size(),
                              " stages summing to ", sum, "; need ", p.pp, " summing to ",
                              c.num_layers));
    }
  }
  if (p.tp > 1) {
    const int t = p.tp;
    if (c.NumLayersOf(LayerKind::kKda) > 0 && c.kda.num_heads % t != 0) {
      return bad(absl::StrCat("parallel.tp: ", t, " does not divide the ", c.kda.num_heads,
                              " KDA heads (linear_attn_config.num_heads)"));
    }
    if (c.NumLayersOf(LayerKind::kMla) > 0 && c.mla.num_heads % t != 0) {
      return bad(absl::StrCat("parallel.tp: ", t, " does not divide the ", c.mla.num_heads,
                              " MLA heads (num_attention_heads)"));
    }
    if (c.dense_intermediate % t != 0) {
      return bad(absl::StrCat("parallel.tp: ", t, " does not divide intermediate_size ",
                              c.dense_intermediate));
    }
    const int64_t shared = c.moe.intermediate * c.moe.num_shared;
    if (shared % t != 0) {
      return bad(absl::StrCat("parallel.tp: ", t, " does not divide the shared experts' ",
                              shared, " columns"));
    }
    if (p.ep == 1 && c.moe.num_experts > 0) {
      const int64_t align = c.moe.mxfp4_experts ? 32 * t : t;
      if (c.moe.intermediate % align != 0) {
        return bad(absl::StrCat("parallel.tp: moe_intermediate_size ", c.moe.intermediate,
                                " must split into ", t, " parts",
                                c.moe.mxfp4_experts ? " of whole 32-column MXFP4 blocks" : ""));
      }
    }
  }
  if (p.ep > 1) {
    if (c.moe.num_experts == 0) return bad("parallel.ep: the model has no experts");
    if (c.moe.num_experts % p.ep != 0) {
      return bad(absl::StrCat("parallel.ep: ", p.ep, " does not divide the ", c.moe.num_experts,
                              " experts (num_experts)"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> StageBoundaries(const ModelConfig& c, const ParallelLayout& p) {
  std::vector<int64_t> b = {0};
  if (!p.stage_layers.empty()) {
    for (int64_t n : p.stage_layers) b.push_back(b.back() + n);
    return b;
  }
  // As even as possible; earlier stages take the remainder (the last stage also runs lm_head).
  const int64_t base = c.num_layers / p.pp, extra = c.num_layers % p.pp;
  for (int s = 0; s < p.pp; ++s) b.push_back(b.back() + base + (s < extra ? 1 : 0));
  return b;
}

Shard Shard::For(const ModelConfig& c, const ParallelLayout& p, int rank) {
  Shard s;
  s.layout = p;
  s.rank = rank;
  s.stage = rank / p.group();
  s.local = rank % p.group();
  const std::vector<int64_t> b = StageBoundaries(c, p);
  s.first_layer = b[s.stage];
  s.end_layer = b[s.stage + 1];
  return s;
}

std::string Shard::Describe() const {
  return absl::StrCat("rank ", rank, ": stage ", stage, "/", layout.pp, " layers [", first_layer,
                      ", ", end_layer, "), tp ", tp_rank(), "/", tp_size(), ", ep ", ep_rank(),
                      "/", ep_size());
}

ModelConfig ShardConfig(const ModelConfig& c, const Shard& s) {
  ModelConfig out = c;
  const int t = s.tp_size();
  out.kda.num_heads = c.kda.num_heads / t;
  out.mla.num_heads = c.mla.num_heads / t;
  out.dense_intermediate = c.dense_intermediate / t;
  out.moe.num_shared = c.moe.num_shared;  // shared width divides below via intermediate
  if (s.ep_size() == 1) out.moe.intermediate = c.moe.intermediate / t;
  // Layers outside the stage keep their kinds (indices stay global) but hold no state.
  out.stage_first_layer = s.first_layer;
  out.stage_end_layer = s.end_layer;
  return out;
}

}  // namespace kimi
