#include "engine/cuda/forward.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attn_res.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/kda_chunk.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/weight_gemm.h"

namespace kimi::gpu {
namespace {

// Hands out 256-byte aligned pieces of one allocation; with a null base it only measures.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* Take(int64_t n) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += (std::max<int64_t>(n, 0) * static_cast<int64_t>(sizeof(T)) + 255) / 256 * 256;
    return p;
  }
  int64_t offset() const { return off_; }
  void Seek(int64_t off) { off_ = off; }

 private:
  char* base_;
  int64_t off_ = 0;
};

// Widths of the model's matrices that the config does not name (low ranks, intermediates).
struct Widths {
  int64_t f_rank = 0, g_rank = 0, mlp = 0, expert = 0;
};

Widths WidthsOf(const DeviceModel& m) {
  Widths w;
  for (const DeviceLayer& L : m.layers()) {
    w.f_rank = std::max(w.f_rank, L.kda.f_a.rows);
    w.g_rank = std::max(w.g_rank, L.kda.g_a.rows);
    w.mlp = std::max({w.mlp, L.mlp.gate.rows, L.moe.shared.gate.rows});
    w.expert = std::max(w.expert, L.moe.expert_rows);
  }
  return w;
}

constexpr int kChunk = 64;
constexpr int64_t kChunkWorkspaceBytes = int64_t{256} << 20;

}  // namespace

Forward::Forward(const DeviceModel& model, DeviceState& state, cuda::Gemm& gemm,
                 cuda::GemmPrecision precision)
    : model_(model), state_(state), gemm_(gemm), precision_(precision) {}

Forward::~Forward() {
  if (plan_host_mem_) cudaFreeHost(plan_host_mem_);
}

absl::Status Forward::Reserve(int64_t tokens, int64_t seqs, int64_t page_entries,
                              int64_t logit_rows, bool* moved) {
  *moved = false;
  if (tokens <= cap_tokens_ && seqs <= cap_seqs_ && page_entries <= cap_pages_ &&
      logit_rows <= cap_logits_) {
    return absl::OkStatus();
  }
  // Grow geometrically so a run of growing steps reallocates a few times only.
  auto grow = [](int64_t want, int64_t have) {
    return want <= have ? have : std::max<int64_t>(want, 2 * have);
  };
  const int64_t T = grow(tokens, cap_tokens_), S = grow(seqs, cap_seqs_);
  const int64_t PT = grow(std::max<int64_t>(page_entries, 1), cap_pages_);
  const int64_t LR = grow(logit_rows, cap_logits_);
  // From here on the old buffers are gone: graphs are stale even if an allocation fails, and
  // nothing may be enqueued until a Reserve succeeds.
  *moved = true;
  cap_tokens_ = cap_seqs_ = cap_pages_ = cap_logits_ = 0;

  const ModelConfig& c = model_.config();
  const Widths w = WidthsOf(model_);
  const int64_t d = c.hidden, NB = c.AttnResBankRows();
  const int64_t H = c.kda.num_heads, K = c.kda.head_dim, P = c.kda.projection();
  const MlaConfig& m = c.mla;
  const int64_t Hm = m.num_heads, width = m.cache_width(), vh = Hm * m.v_head_dim;
  const int64_t E = c.moe.num_experts, k = c.moe.top_k, D = c.ExpertDim();
  const bool has_kda = c.StageLayersOf(LayerKind::kKda) > 0;
  const bool has_mla = c.StageLayersOf(LayerKind::kMla) > 0;
  const bool has_moe = E > 0;
  const int64_t max_tiles = has_moe ? cuda::MoeMaxTiles(T, k, E, cuda::kWeightGemmTileRows) : 0;
  int64_t lanes = 0;
  if (has_kda) {
    const int64_t per_lane = cuda::KdaChunkWorkspaceFloats(H, K, K, kChunk, 1);
    lanes = std::clamp<int64_t>(kChunkWorkspaceBytes / 4 / per_lane, 1, S);
  }

  auto carve = [&](Carver& cv) {
    hidden_ = cv.Take<float>(T * d);
    normed_ = cv.Take<float>(T * d);
    y_ = cv.Take<float>(T * d);
    mix_ = c.attn_res_block > 0 ? cv.Take<float>(T * d) : nullptr;
    bank_ = c.attn_res_block > 0 ? cv.Take<float>(T * NB * d) : nullptr;
    picked_ = cv.Take<float>(LR * d);
    logits_ = cv.Take<float>(LR * c.vocab);
    // The token mixer's scratch: KDA and MLA share one region (a layer is one or the other).
    const int64_t mixer = cv.offset();
    if (has_kda) {
      q_raw_ = cv.Take<float>(T * P);
      k_raw_ = cv.Take<float>(T * P);
      v_raw_ = cv.Take<float>(T * P);
      g_raw_ = cv.Take<float>(T * P);
      gate_ = cv.Take<float>(T * P);
      q_c_ = cv.Take<float>(T * P);
      k_c_ = cv.Take<float>(T * P);
      v_c_ = cv.Take<float>(T * P);
      g_ = cv.Take<float>(T * P);
      o_ = cv.Take<float>(T * P);
      low_ = cv.Take<float>(T * w.f_rank);
      gate_low_ = cv.Take<float>(T * w.g_rank);
      beta_raw_ = cv.Take<float>(T * H);
      beta_ = cv.Take<float>(T * H);
      chunk_ws_floats_ = cuda::KdaChunkWorkspaceFloats(H, K, K, kChunk, lanes);
      chunk_ws_ = cv.Take<float>(chunk_ws_floats_);
    }
    const int64_t kda_end = cv.offset();
    cv.Seek(mixer);
    if (has_mla) {
      latent_ = cv.Take<float>(T * width);
      cq_ = cv.Take<float>(T * m.q_lora_rank);
      q_ = cv.Take<float>(T * Hm * m.qk_head_dim());
      qa_ = cv.Take<float>(T * Hm * width);
      o_lat_ = cv.Take<float>(T * Hm * m.kv_lora_rank);
      mo_ = cv.Take<float>(T * vh);
      mgate_ = cv.Take<float>(T * vh);
    }
    cv.Seek(std::max(kda_end, cv.offset()));
    // The FFN's scratch: the dense MLP's (also the shared experts') and the routed experts'.
    fg_ = cv.Take<float>(T * w.mlp);
    fu_ = cv.Take<float>(T * w.mlp);
    if (has_moe) {
      router_ = cv.Take<float>(T * E);
      route_w_ = cv.Take<float>(T * k);
      z_ = cv.Take<float>(T * D);
      xs_ = cv.Take<float>(T * k * D);
      eg_ = cv.Take<float>(T * k * w.expert);
      eu_ = cv.Take<float>(T * k * w.expert);
      res_ = cv.Take<float>(T * k * D);
      ycomb_ = cv.Take<float>(T * D);
      shared_ = cv.Take<float>(T * d);
      ids_ = cv.Take<int32_t>(T * k);
      expert_offset_ = cv.Take<int32_t>(E + 1);
      sorted_token_ = cv.Take<int32_t>(T * k);
      row_of_ = cv.Take<int32_t>(T * k);
      tile_group_ = cv.Take<int32_t>(max_tiles);
      tile_row0_ = cv.Take<int32_t>(max_tiles);
      tile_row_end_ = cv.Take<int32_t>(max_tiles);
      num_tiles_ = cv.Take<int32_t>(1);
    }
  };
  Carver measure(nullptr);
  carve(measure);
  arena_.Reset();
  absl::StatusOr<cuda::DeviceBuffer> arena = cuda::DeviceBuffer::Allocate(measure.offset());
  if (!arena.ok()) return arena.status();
  arena_ = std::move(*arena);
  Carver real(arena_.as<char>());
  carve(real);

  // The plan: one int32 array, staged in pinned host memory.
  const int64_t ints = 3 * T + LR + 5 * S + PT;
  plan_dev_.Reset();
  absl::StatusOr<cuda::DeviceBuffer> plan = cuda::DeviceBuffer::Allocate(ints * 4);
  if (!plan.ok()) return plan.status();
  plan_dev_ = std::move(*plan);
  if (plan_host_mem_) cudaFreeHost(plan_host_mem_);
  plan_host_mem_ = nullptr;
  KIMI_RETURN_IF_ERROR(cuda::CudaStatus(
      cudaMallocHost(reinterpret_cast<void**>(&plan_host_mem_), static_cast<size_t>(ints * 4)),
      "cudaMallocHost (plan)"));
  plan_ints_ = ints;
  auto lay = [&](int32_t* base, PlanArrays* a) {
    a->tokens = base;
    a->tok_seq = a->tokens + T;
    a->tok_pos = a->tok_seq + T;
    a->logit_rows = a->tok_pos + T;
    a->seq_offset = a->logit_rows + LR;
    a->seq_count = a->seq_offset + S;
    a->seq_pos0 = a->seq_count + S;
    a->seq_slot = a->seq_pos0 + S;
    a->seq_page_start = a->seq_slot + S;
    a->pages = a->seq_page_start + S;
  };
  lay(plan_host_mem_, &host_);
  lay(plan_dev_.as<int32_t>(), &dev_);

  int64_t max_cols = std::max(model_.max_gemm_cols(), d);
  KIMI_RETURN_IF_ERROR(gemm_.Reserve(std::max(T, LR) * max_cols));
  cap_tokens_ = T;
  cap_seqs_ = S;
  cap_pages_ = PT;
  cap_logits_ = LR;
  return absl::OkStatus();
}

absl::Status Forward::UploadPlan(cudaStream_t stream) {
  return cuda::CudaStatus(cudaMemcpyAsync(plan_dev_.get(), plan_host_mem_,
                                          static_cast<size_t>(plan_ints_ * 4),
                                          cudaMemcpyHostToDevice, stream),
                          "plan upload");
}

cuda::DeviceBatch Forward::Batch(const StepShape& s) const {
  cuda::DeviceBatch b;
  b.seq_offset = dev_.seq_offset;
  b.seq_count = dev_.seq_count;
  b.seq_pos0 = dev_.seq_pos0;
  b.seq_slot = dev_.seq_slot;
  b.seq_page_start = dev_.seq_page_start;
  b.pages = dev_.pages;
  b.tok_seq = dev_.tok_seq;
  b.tok_pos = dev_.tok_pos;
  b.num_seqs = s.seqs;
  b.num_tokens = s.tokens;
  return b;
}

absl::Status Forward::Linear(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                             int64_t m, cudaStream_t st) {
  return gemm_.Linear(y, ldy, x, ldx, w, m, precision_, st);
}

// Block Attention Residuals as in engine.cc's Residual: `hidden_` is the current block's partial
// sum, `bank_` [T, NB, d] the closed blocks (row 0 = embedding).
absl::Status Forward::Enqueue(const StepShape& s, cudaStream_t st) {
  const ModelConfig& c = model_.config();
  const int64_t T = s.tokens, d = c.hidden;
  if (T <= 0 || T > cap_tokens_ || s.seqs > cap_seqs_ || s.logit_rows > cap_logits_) {
    return absl::FailedPreconditionError(absl::StrCat("Forward: step of ", T, " tokens, ", s.seqs,
                                                      " sequences exceeds the reserved buffers"));
  }
  KIMI_RETURN_IF_ERROR(cuda::EmbeddingGather(hidden_, model_.embed(), dev_.tokens, T, st));
  const bool attn_res = c.attn_res_block > 0;
  const int64_t stride = c.AttnResBankRows() * d;
  int64_t banked = 0;
  // The input of the next sublayer: a softmax-over-depth mix, or the residual stream itself.
  auto input = [&](const float* w, const float** in) -> absl::Status {
    *in = hidden_;
    if (!attn_res || banked == 0) return absl::OkStatus();
    *in = mix_;
    return cuda::AttnRes(mix_, nullptr, bank_, stride, banked, hidden_, w, T, d, c.rms_eps, st);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const DeviceLayer& L = model_.layers()[l];
    const float* in = nullptr;
    KIMI_RETURN_IF_ERROR(input(L.attn_res_attn, &in));
    bool restart = false;
    if (attn_res && l % c.attn_res_block == 0) {  // bank the partial sum; it restarts
      KIMI_RETURN_IF_ERROR(cuda::CopyRows(bank_ + banked * d, stride, hidden_, d, nullptr, T, d, st));
      ++banked;
      restart = true;
    }
    KIMI_RETURN_IF_ERROR(cuda::RmsNorm(normed_, in, L.input_norm, T, d, c.rms_eps, st));
    KIMI_RETURN_IF_ERROR(c.layer_kinds[l] == LayerKind::kKda ? Kda(L, c.StageIndex(l), s, st)
                                                             : Mla(L, c.StageIndex(l), s, st));
    if (restart) {
      KIMI_RETURN_IF_ERROR(cuda::CudaStatus(
          cudaMemcpyAsync(hidden_, y_, static_cast<size_t>(T * d * 4), cudaMemcpyDeviceToDevice, st),
          "residual restart"));
    } else {
      KIMI_RETURN_IF_ERROR(cuda::AddInPlace(hidden_, y_, T * d, st));
    }
    KIMI_RETURN_IF_ERROR(input(L.attn_res_mlp, &in));
    KIMI_RETURN_IF_ERROR(cuda::RmsNorm(normed_, in, L.post_norm, T, d, c.rms_eps, st));
    KIMI_RETURN_IF_ERROR(L.is_moe ? Moe(L.moe, normed_, y_, T, st) : Mlp(L.mlp, normed_, y_, T, st));
    KIMI_RETURN_IF_ERROR(cuda::AddInPlace(hidden_, y_, T * d, st));
  }
  // The final (mix,) norm and lm_head on the rows that need logits only.
  const float* fin = nullptr;
  KIMI_RETURN_IF_ERROR(input(model_.attn_res_out(), &fin));
  const int64_t n = s.logit_rows;
  if (n == 0) return absl::OkStatus();
  KIMI_RETURN_IF_ERROR(cuda::CopyRows(picked_, d, fin, d, dev_.logit_rows, n, d, st));
  KIMI_RETURN_IF_ERROR(cuda::RmsNorm(picked_, picked_, model_.final_norm(), n, d, c.rms_eps, st));
  return Linear(logits_, c.vocab, picked_, d, model_.lm_head(), n, st);
}

}  // namespace kimi::gpu
