#include "engine/engine.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/layers.h"
#include "engine/step_memory.h"
#include "kernels/cpu/ops.h"

namespace kimi {
namespace {

using layers::SeqSpan;
using layers::StepLayout;

absl::Status Validate(const ModelConfig& c, std::span<const SequenceStep> batch,
                      const EngineState& state) {
  const bool has_kda = c.StageLayersOf(LayerKind::kKda) > 0;
  const bool has_mla = c.StageLayersOf(LayerKind::kMla) > 0;
  if (has_kda && !state.kda) return absl::InvalidArgumentError("Step: no KDA state pool");
  if (has_mla && !state.kv) return absl::InvalidArgumentError("Step: no MLA KV cache");
  return ValidateBatch(c, batch, has_kda ? state.kda->num_slots() : 0,
                       has_mla ? state.kv->num_pages() : 0, has_mla ? state.kv->page_size() : 1);
}

// Kimi K3's Block Attention Residuals replace h = h + f(h) (KIMI_K3.md 5.1). `hidden` holds the
// current block's partial sum; `bank` [T, NB, hidden] the closed blocks (row 0 = embedding).
struct Residual {
  const ModelConfig& c;
  int64_t T;
  std::vector<float> hidden;  // [T, d]
  std::vector<float> bank;    // [T, NB, d]
  int64_t banked = 0;
  std::vector<float> mix;  // [T, d] scratch

  bool attn_res() const { return c.attn_res_block > 0; }
  int64_t stride() const { return c.AttnResBankRows() * c.hidden; }

  // The input of the next sublayer: a softmax-over-depth mix, or the residual stream itself (here
  // the final norm's; between sublayers AddThenNormedInput makes it token by token).
  const float* Input(const float* w) {
    if (!attn_res() || banked == 0) return hidden.data();
    cpu::AttnRes(mix.data(), nullptr, bank.data(), stride(), banked, hidden.data(), w, T, c.hidden,
                 c.rms_eps);
    return mix.data();
  }
  void Add(const float* y, bool restart) {
    if (restart) {
      std::copy_n(y, T * c.hidden, hidden.data());
    } else {
      for (int64_t i = 0; i < T * c.hidden; ++i) hidden[i] += y[i];
    }
  }
  // Between two sublayers, token by token: Add(y, restart) (none when y is null), the next
  // sublayer's Input(w) RMS-normalised into `normed`, and with `close_block` the partial sum banked
  // as a closed block (after the input was read from it). Each token's rows are one thread's work,
  // in one parallel section; as three steps (a serial add, a parallel mix, a serial or parallel
  // norm) they moved rows between the cores twice more: steps alternated every ten in one process
  // took 1.005-1.010 times as long at batch-8 k3-mini, 1.002-1.004 at batch 32, 1.001-1.019 at
  // batch-8 kimi-linear-small (level at batch 1). The same values as the steps one by one.
  void AddThenNormedInput(const float* y, bool restart, const float* w, const float* norm,
                          bool close_block, float* normed) {
    const int64_t d = c.hidden;
    const bool mix_rows = attn_res() && banked > 0;
    // Without the mix a token is an add and a norm, a fraction of a microsecond: eight a part.
    cpu::ParallelFor(T, mix_rows ? 1 : 8, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* h = &hidden[t * d];
        if (y && restart) {
          std::copy_n(y + t * d, d, h);
        } else if (y) {
          for (int64_t i = 0; i < d; ++i) h[i] += y[t * d + i];
        }
        const float* in = h;
        if (mix_rows) {
          cpu::AttnRes(&mix[t * d], nullptr, &bank[t * stride()], stride(), banked, h, w, 1, d,
                       c.rms_eps);
          in = &mix[t * d];
        }
        if (close_block) std::copy_n(h, d, &bank[t * stride() + banked * d]);
        cpu::RmsNorm(&normed[t * d], in, norm, 1, d, c.rms_eps);
      }
    });
    if (close_block) ++banked;
  }
};

// Message tags of pipeline traffic (world communicator).
constexpr int kTagActivations = 11;
constexpr int kTagLogits = 12;

// The sequence of rows that get logits, in batch order.
std::vector<int64_t> LogitRows(std::span<const SequenceStep> batch, const StepLayout& layout,
                               std::vector<int64_t>* first_row) {
  std::vector<int64_t> rows;
  first_row->assign(batch.size(), -1);
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqSpan& s = layout.seqs[i];
    if (batch[i].logits == LogitsWanted::kNone) continue;
    (*first_row)[i] = static_cast<int64_t>(rows.size());
    const int64_t from = batch[i].logits == LogitsWanted::kAll ? 0 : s.count - 1;
    for (int64_t t = from; t < s.count; ++t) rows.push_back(s.offset + t);
  }
  return rows;
}

}  // namespace

Engine::Engine(const Model& model, EngineComms comms, EngineOptions options)
    : model_(model), comms_(comms), options_(options) {
  KeepStepMemory();
}

absl::Status Engine::Step(std::span<const SequenceStep> batch, EngineState& state,
                          StepOutput* out) const {
  const ModelConfig& c = model_.config();
  const Shard& sh = model_.shard();
  if (absl::Status s = Validate(c, batch, state); !s.ok()) return s;
  const cpu::ActivationScope precision(options_.activation);
  out->vocab = c.vocab;
  {
    StepLayout whole;
    for (const SequenceStep& s : batch) {
      whole.seqs.push_back(SeqSpan{whole.tokens, static_cast<int64_t>(s.tokens.size()), s.pos0,
                                   s.kda_slot, s.pages});
      whole.tokens += static_cast<int64_t>(s.tokens.size());
    }
    LogitRows(batch, whole, &out->first_row);
  }
  // Pipeline stages overlap on micro-batches: stage s works on micro-batch m + 1 while stage s + 1
  // works on m. Sequences are independent, so splitting the batch changes no result; every rank
  // derives the same split from the batch.
  const size_t parts = sh.layout.pp > 1 ? std::min<size_t>(sh.layout.pp, batch.size()) : 1;
  int64_t total_tokens = 0;
  for (const SequenceStep& s : batch) total_tokens += static_cast<int64_t>(s.tokens.size());
  // One part sizes the logits itself and overwrites every element (no zero fill of batch x
  // vocab floats per step); micro-batches append theirs.
  if (parts > 1) out->logits.clear();
  out->moe.clear();
  size_t begin = 0;
  int64_t tokens_done = 0;
  for (size_t part = 0; part < parts; ++part) {
    // Contiguous groups of about equal token counts.
    size_t end = begin;
    const int64_t target =
        total_tokens * static_cast<int64_t>(part + 1) / static_cast<int64_t>(parts);
    while (end < batch.size() && (tokens_done < target || end == begin) &&
           batch.size() - end > parts - part - 1) {
      tokens_done += static_cast<int64_t>(batch[end].tokens.size());
      ++end;
    }
    if (part + 1 == parts) {
      while (end < batch.size()) tokens_done += static_cast<int64_t>(batch[end++].tokens.size());
    }
    // One part (no pipeline) writes the caller's buffer directly: a caller that keeps its
    // StepOutput between steps reuses the memory of up to batch x vocab floats.
    if (parts == 1) {
      if (absl::Status s = RunStage(batch, state, &out->logits, &out->moe); !s.ok()) {
        out->logits.clear();  // no stale rows from the previous step
        return s;
      }
      begin = end;
      continue;
    }
    std::vector<float> logits;
    if (absl::Status s = RunStage(batch.subspan(begin, end - begin), state, &logits, &out->moe);
        !s.ok()) {
      return s;
    }
    out->logits.insert(out->logits.end(), logits.begin(), logits.end());
    begin = end;
  }
  // Rank 0 (first stage, first position) gets the logits from the last stage, in one message
  // after every micro-batch (an earlier send would wait on rank 0 while it still feeds stage 1).
  if (sh.layout.pp > 1) {
    int64_t n = 0;
    for (const SequenceStep& s : batch) {
      n += s.logits == LogitsWanted::kAll    ? static_cast<int64_t>(s.tokens.size())
           : s.logits == LogitsWanted::kLast ? 1
                                             : 0;
    }
    if (sh.last_stage() && sh.local == 0) {
      return comms_.world->Send(out->logits.data(), n * c.vocab * 4, 0, kTagLogits);
    }
    if (sh.rank == 0) {
      out->logits.resize(n * c.vocab);
      return comms_.world->Recv(out->logits.data(), n * c.vocab * 4, sh.RankOf(sh.layout.pp - 1, 0),
                                kTagLogits);
    }
    out->logits.clear();
  }
  return absl::OkStatus();
}

absl::Status Engine::RunStage(std::span<const SequenceStep> batch, EngineState& state,
                              std::vector<float>* logits_out,
                              std::vector<MoeLayerStats>* moe_stats) const {
  const ModelConfig& c = model_.config();
  const ModelWeights& w = model_.weights();
  const Shard& sh = model_.shard();

  StepLayout layout;
  std::vector<int32_t> tokens;
  for (const SequenceStep& s : batch) {
    layout.seqs.push_back(
        SeqSpan{layout.tokens, static_cast<int64_t>(s.tokens.size()), s.pos0, s.kda_slot, s.pages});
    layout.tokens += static_cast<int64_t>(s.tokens.size());
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
  }
  const int64_t T = layout.tokens, d = c.hidden;
  layers::Split split;
  if (sh.layout.group() > 1) {
    split.stage = comms_.stage;
    split.heads = split.mlp = sh.tp_size() > 1;
    split.shared = sh.tp_size() > 1 && sh.ep_size() == 1;
    split.experts = sh.tp_size() > 1 || sh.ep_size() > 1;
    split.expert_ranks = sh.ep_size();
    split.expert_rank = sh.ep_rank();
    split.replicate_threshold = sh.layout.replicate_threshold;
    split.max_replicas = sh.layout.max_replicated_experts;
  }

  Residual r{c, T, std::vector<float>(T * d), {}, 0, {}};
  if (r.attn_res()) {
    r.bank.assign(T * r.stride(), 0.0f);
    r.mix.resize(T * d);
  }
  // The residual state entering this stage: the embedding, or what the previous stage sent (the
  // partial sum, then the banked AttnRes rows; how many are banked follows from the layer index).
  if (sh.first_stage()) {
    for (int64_t t = 0; t < T; ++t) cpu::DequantizeRow(&r.hidden[t * d], w.embed, tokens[t]);
  } else {
    const int prev = sh.RankOf(sh.stage - 1, sh.local);
    if (absl::Status s = comms_.world->Recv(r.hidden.data(), T * d * 4, prev, kTagActivations);
        !s.ok()) {
      return s;
    }
    if (r.attn_res()) {
      r.banked = (sh.first_layer + c.attn_res_block - 1) / c.attn_res_block;
      if (absl::Status s =
              comms_.world->Recv(r.bank.data(), T * r.stride() * 4, prev, kTagActivations);
          !s.ok()) {
        return s;
      }
    }
  }

  std::vector<float> normed(T * d), y(T * d);
  for (int64_t l = sh.first_layer; l < sh.end_layer; ++l) {
    const LayerWeights& L = w.layers[l];
    // The previous layer's feed-forward output (none before the stage's first layer), then this
    // layer's attention input; before the attention sublayer of a block-write layer the partial
    // sum is banked and restarts.
    const bool restart = r.attn_res() && l % c.attn_res_block == 0;
    r.AddThenNormedInput(l > sh.first_layer ? y.data() : nullptr, /*restart=*/false,
                         L.attn_res_attn, L.input_norm, restart, normed.data());
    const absl::Status mixed = c.layer_kinds[l] == LayerKind::kKda
                                   ? layers::Kda(c, L.kda, c.StageIndex(l), normed.data(), y.data(),
                                                 layout, *state.kda, split)
                                   : layers::Mla(c, L.mla, c.StageIndex(l), normed.data(), y.data(),
                                                 layout, *state.kv, split);
    if (!mixed.ok()) return mixed;
    r.AddThenNormedInput(y.data(), restart, L.attn_res_mlp, L.post_norm, /*close_block=*/false,
                         normed.data());
    if (L.is_moe) {
      MoeLayerStats stats;
      stats.layer = l;
      if (absl::Status s = layers::Moe(c, L.moe, normed.data(), y.data(), T, split, &stats);
          !s.ok()) {
        return s;
      }
      if (moe_stats) moe_stats->push_back(stats);
    } else {
      layers::GatedMlp(c, L.mlp, normed.data(), y.data(), T);
      if (split.mlp) {
        if (absl::Status s = split.Reduce(y.data(), T * d); !s.ok()) return s;
      }
    }
  }
  if (sh.end_layer > sh.first_layer) r.Add(y.data(), /*restart=*/false);

  std::vector<int64_t> first_row;
  const std::vector<int64_t> rows = LogitRows(batch, layout, &first_row);
  const int64_t n = static_cast<int64_t>(rows.size());
  if (!sh.last_stage()) {
    logits_out->clear();
    const int next = sh.RankOf(sh.stage + 1, sh.local);
    if (absl::Status s = comms_.world->Send(r.hidden.data(), T * d * 4, next, kTagActivations);
        !s.ok()) {
      return s;
    }
    if (r.attn_res()) {
      return comms_.world->Send(r.bank.data(), T * r.stride() * 4, next, kTagActivations);
    }
    return absl::OkStatus();
  }

  // The final (mix,) norm and lm_head on the rows that need logits only.
  const float* final_in = r.Input(w.attn_res_out);
  std::vector<float> picked(n * d);
  for (int64_t i = 0; i < n; ++i) std::copy_n(final_in + rows[i] * d, d, &picked[i * d]);
  cpu::RmsNorm(picked.data(), picked.data(), w.final_norm, n, d, c.rms_eps);
  const int g = sh.layout.group();
  logits_out->resize(n * c.vocab);
  if (g == 1) {
    cpu::MatMul(logits_out->data(), picked.data(), w.lm_head, n);
    return absl::OkStatus();
  }
  // Each rank of the stage holds a chunk of the vocabulary; gather and interleave the chunks.
  const int64_t chunk = w.lm_head_rows_per_rank;
  std::vector<float> mine(n * chunk, 0.0f), all(g * n * chunk);
  cpu::MatMul(mine.data(), chunk, picked.data(), d, w.lm_head, n);
  if (absl::Status s = comms_.stage->AllGather(mine.data(), n * chunk, all.data()); !s.ok()) {
    return s;
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < g; ++k) {
      const int64_t v0 = k * chunk, count = std::min<int64_t>(chunk, c.vocab - v0);
      if (count <= 0) continue;
      std::copy_n(&all[(k * n + i) * chunk], count, &(*logits_out)[i * c.vocab + v0]);
    }
  }
  return absl::OkStatus();
}

}  // namespace kimi
