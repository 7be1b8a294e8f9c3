// The sublayers of the GPU forward step (engine/kda_layer.cc, mla_layer.cc, ffn.cc on the device).
// Each reads normed_ [T, hidden] (or its x argument) and writes y_ (or out) [T, hidden].
#include <cmath>

#include "engine/cuda/forward.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/causal_conv.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/kda_chunk.h"
#include "kernels/cuda/kda_decode.h"
#include "kernels/cuda/kda_gate.h"
#include "kernels/cuda/mla_attention.h"
#include "kernels/cuda/mla_cache.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/moe_route.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/weight_gemm.h"

namespace kimi::gpu {

// KDA (KIMI_LINEAR.md 3.1, KIMI_K3.md 5.3). Sequences with one token (decode) go through the
// fused decode kernel, the others through conv -> L2 norm -> gate -> chunked KDA -> gated norm,
// as the CPU engine splits them (recurrent for one token, chunked otherwise), so a sequence's
// result does not depend on what else is in the step.
absl::Status Forward::Kda(const DeviceLayer& L, int64_t kda_index, const StepShape& s,
                          cudaStream_t st) {
  const ModelConfig& c = model_.config();
  const DeviceKda& w = L.kda;
  const int64_t T = s.tokens, d = c.hidden;
  const int64_t H = c.kda.num_heads, K = c.kda.head_dim, P = c.kda.projection();
  const int W = static_cast<int>(c.kda.conv_kernel);
  const float scale = 1.0f / std::sqrt(static_cast<float>(K));
  const cuda::DeviceBatch b = Batch(s);
  float* state = state_.Kda(kda_index);
  const int64_t slot_stride = state_.slot_floats(), conv_offset = state_.kda_recurrent();

  KIMI_RETURN_IF_ERROR(Linear(q_raw_, P, normed_, d, w.q_proj, T, st));
  KIMI_RETURN_IF_ERROR(Linear(k_raw_, P, normed_, d, w.k_proj, T, st));
  KIMI_RETURN_IF_ERROR(Linear(v_raw_, P, normed_, d, w.v_proj, T, st));
  KIMI_RETURN_IF_ERROR(Linear(low_, w.f_a.rows, normed_, d, w.f_a, T, st));
  KIMI_RETURN_IF_ERROR(Linear(g_raw_, P, low_, w.f_a.rows, w.f_b, T, st));
  KIMI_RETURN_IF_ERROR(Linear(beta_raw_, H, normed_, d, w.b_proj, T, st));
  if (c.kda.full_rank_gate) {
    KIMI_RETURN_IF_ERROR(Linear(gate_, P, normed_, d, w.g_proj, T, st));
  } else {
    KIMI_RETURN_IF_ERROR(Linear(gate_low_, w.g_a.rows, normed_, d, w.g_a, T, st));
    KIMI_RETURN_IF_ERROR(Linear(gate_, P, gate_low_, w.g_a.rows, w.g_b, T, st));
  }
  if (s.has_prefill) {
    const int64_t hist = static_cast<int64_t>(W - 1) * P;
    float* conv_state = state + conv_offset;
    const float* raw[3] = {q_raw_, k_raw_, v_raw_};
    float* conv_out[3] = {q_c_, k_c_, v_c_};
    const float* taps[3] = {w.q_conv, w.k_conv, w.v_conv};
    for (int i = 0; i < 3; ++i) {
      KIMI_RETURN_IF_ERROR(cuda::CausalConvSilu(conv_out[i], P, conv_state + i * hist, slot_stride,
                                                raw[i], P, taps[i], W, P, b, /*min_count=*/2, st));
    }
    KIMI_RETURN_IF_ERROR(cuda::L2Norm(q_c_, T * H, K, 1e-6f, st));
    KIMI_RETURN_IF_ERROR(cuda::L2Norm(k_c_, T * H, K, 1e-6f, st));
    KIMI_RETURN_IF_ERROR(
        cuda::KdaGate(g_, g_raw_, w.a_log, w.dt_bias, c.kda.gate_lower_bound, T, H, K, st));
    KIMI_RETURN_IF_ERROR(cuda::Sigmoid(beta_, beta_raw_, T * H, st));
    cuda::KdaChunkArgs a;
    a.o = o_;
    a.state = state;
    a.slot_stride = slot_stride;
    a.q = q_c_;
    a.k = k_c_;
    a.v = v_c_;
    a.g = g_;
    a.beta = beta_;
    a.H = H;
    a.K = K;
    a.V = K;
    a.scale = scale;
    a.chunk = 64;
    a.workspace = chunk_ws_;
    a.workspace_floats = chunk_ws_floats_;
    KIMI_RETURN_IF_ERROR(cuda::KdaChunk(a, b, /*min_count=*/2, st));
    // Over every row; the decode rows are rewritten by the fused kernel below.
    KIMI_RETURN_IF_ERROR(cuda::RmsNormGated(o_, gate_, w.o_norm, T * H, K, c.rms_eps, st));
  }
  if (s.has_decode) {
    cuda::KdaDecodeArgs a;
    a.o = o_;
    a.state = state;
    a.slot_stride = slot_stride;
    a.conv_offset = conv_offset;
    a.q_raw = q_raw_;
    a.k_raw = k_raw_;
    a.v_raw = v_raw_;
    a.ld_qkv = P;
    a.g_raw = g_raw_;
    a.beta_raw = beta_raw_;
    a.gate = gate_;
    a.conv_q = w.q_conv;
    a.conv_k = w.k_conv;
    a.conv_v = w.v_conv;
    a.a_log = w.a_log;
    a.dt_bias = w.dt_bias;
    a.o_norm = w.o_norm;
    a.has_lower_bound = c.kda.gate_lower_bound.has_value();
    a.lower_bound = c.kda.gate_lower_bound.value_or(0.0f);
    a.H = H;
    a.K = K;
    a.V = K;
    a.W = W;
    a.scale = scale;
    a.l2_eps = 1e-6f;
    a.norm_eps = c.rms_eps;
    KIMI_RETURN_IF_ERROR(cuda::KdaDecode(a, b, st));
  }
  return Linear(y_, d, o_, P, w.o_proj, T, st);
}

// MLA, NoPE, absorbed (KIMI_LINEAR.md 3.2, KIMI_K3.md 5.4): the normalised latent and k_pe are
// cached per position in pages; queries are absorbed into the latent space (uk_t = W_UK^T per
// head), attention runs there, and W_UV maps each head's result back.
absl::Status Forward::Mla(const DeviceLayer& L, int64_t mla_index, const StepShape& s,
                          cudaStream_t st) {
  const ModelConfig& c = model_.config();
  const MlaConfig& m = c.mla;
  const DeviceMla& w = L.mla;
  const int64_t T = s.tokens, d = c.hidden, H = m.num_heads, qk = m.qk_head_dim();
  const int64_t R = m.kv_lora_rank, rope = m.qk_rope_head_dim, width = m.cache_width();
  const int64_t nope = m.qk_nope_head_dim, vd = m.v_head_dim;
  const cuda::DeviceBatch b = Batch(s);

  KIMI_RETURN_IF_ERROR(Linear(latent_, width, normed_, d, w.kv_a_proj, T, st));
  if (m.q_lora_rank > 0) {
    KIMI_RETURN_IF_ERROR(Linear(cq_, m.q_lora_rank, normed_, d, w.q_a_proj, T, st));
    KIMI_RETURN_IF_ERROR(cuda::RmsNorm(cq_, cq_, w.q_a_norm, T, m.q_lora_rank, m.norm_eps, st));
    KIMI_RETURN_IF_ERROR(Linear(q_, H * qk, cq_, m.q_lora_rank, w.q_b_proj, T, st));
  } else {
    KIMI_RETURN_IF_ERROR(Linear(q_, H * qk, normed_, d, w.q_proj, T, st));
  }
  if (m.output_gate) KIMI_RETURN_IF_ERROR(Linear(mgate_, H * vd, normed_, d, w.g_proj, T, st));
  // c_kv normalised in place; k_pe (the last rope columns) is not.
  KIMI_RETURN_IF_ERROR(
      cuda::RmsNorm(latent_, width, latent_, width, w.kv_a_norm, T, R, m.norm_eps, st));
  // qa [T, H, R + rope] = (W_UK_h^T q_nope | q_pe).
  KIMI_RETURN_IF_ERROR(
      cuda::WeightGemmBatched(qa_, H * width, width, q_, H * qk, qk, w.uk_t, R, R, T, H, st));
  KIMI_RETURN_IF_ERROR(cuda::CopyRows(qa_ + R, width, q_ + nope, qk, nullptr, T * H, rope, st));
  float* pool = state_.Kv(mla_index);
  KIMI_RETURN_IF_ERROR(cuda::MlaWriteCache(pool, latent_, width, b, width, state_.page_size(), st));
  KIMI_RETURN_IF_ERROR(cuda::MlaLatentAttention(o_lat_, qa_, pool, b, H, R, rope,
                                                state_.page_size(),
                                                1.0f / std::sqrt(static_cast<float>(qk)), st));
  // o_h = W_UV_h o_lat: head h's value rows start at h * (nope + v) + nope of kv_b_proj.
  KIMI_RETURN_IF_ERROR(cuda::WeightGemmBatched(mo_, H * vd, vd, o_lat_, H * R, R,
                                               w.kv_b_proj.Rows(nope, w.kv_b_proj.rows - nope), vd,
                                               nope + vd, T, H, st));
  if (m.output_gate) KIMI_RETURN_IF_ERROR(cuda::MulSigmoid(mo_, mgate_, T * H * vd, st));
  return Linear(y_, d, mo_, H * vd, w.o_proj, T, st);
}

absl::Status Forward::Mlp(const DeviceMlp& w, const float* x, float* out, int64_t rows,
                          cudaStream_t st) {
  const ModelConfig& c = model_.config();
  const int64_t I = w.gate.rows, in = w.gate.cols;
  KIMI_RETURN_IF_ERROR(Linear(fg_, I, x, in, w.gate, rows, st));
  KIMI_RETURN_IF_ERROR(Linear(fu_, I, x, in, w.up, rows, st));
  KIMI_RETURN_IF_ERROR(
      c.activation == Activation::kSituGlu
          ? cuda::SituGlu(fg_, fg_, fu_, rows * I, c.situ_beta, c.situ_linear_beta, st)
          : cuda::SiluGlu(fg_, fg_, fu_, rows * I, st));
  return Linear(out, w.down.rows, fg_, I, w.down, rows, st);
}

// Router on the full x (fp32: the split-bf16 product whatever the step's precision); routed experts
// on x or its latent, grouped by expert on the device; combined in ascending expert id, latent
// norm and up projection (K3); shared experts on x, unscaled (engine/ffn.cc).
absl::Status Forward::Moe(const DeviceMoe& w, const float* x, float* out, int64_t rows,
                          cudaStream_t st) {
  const ModelConfig& c = model_.config();
  const MoeConfig& m = c.moe;
  const int64_t T = rows, d = c.hidden, E = m.num_experts, k = m.top_k, D = c.ExpertDim();
  const int64_t I = w.expert_rows;
  KIMI_RETURN_IF_ERROR(
      gemm_.Linear(router_, E, x, d, w.router, T, cuda::GemmPrecision::kSplit, st));
  const cpu::MoeRouteParams route{
      E, k, m.num_groups, m.topk_groups, m.renormalize, m.routed_scaling};
  KIMI_RETURN_IF_ERROR(cuda::MoeRoute(ids_, route_w_, router_, w.bias, T, route, st));
  const float* z = x;
  if (m.latent_dim > 0) {
    KIMI_RETURN_IF_ERROR(Linear(z_, D, x, d, w.latent_down, T, st));
    z = z_;
  }
  cuda::MoePlan plan;
  plan.expert_offset = expert_offset_;
  plan.sorted_token = sorted_token_;
  plan.row_of = row_of_;
  plan.tile_group = tile_group_;
  plan.tile_row0 = tile_row0_;
  plan.tile_row_end = tile_row_end_;
  plan.num_tiles = num_tiles_;
  const int64_t tiles = cuda::MoeMaxTiles(T, k, E, cuda::kWeightGemmTileRows);
  KIMI_RETURN_IF_ERROR(cuda::MoePermute(plan, ids_, T, k, E, cuda::kWeightGemmTileRows, st));
  // y [T * k, n] = x [T * k, ldx] times each row's own expert of `experts`, over the plan's tiles.
  const auto grouped = [&](float* y, int64_t n, const float* xin, int64_t ldx,
                           const Weight& experts) {
    return cuda::WeightGemmGrouped(y, n, xin, ldx, experts, n, tile_group_, tile_row0_,
                                   tile_row_end_, num_tiles_, tiles, st);
  };
  KIMI_RETURN_IF_ERROR(cuda::CopyRows(xs_, D, z, D, sorted_token_, T * k, D, st));
  KIMI_RETURN_IF_ERROR(grouped(eg_, I, xs_, D, w.experts_gate));
  KIMI_RETURN_IF_ERROR(grouped(eu_, I, xs_, D, w.experts_up));
  KIMI_RETURN_IF_ERROR(
      c.activation == Activation::kSituGlu
          ? cuda::SituGlu(eg_, eg_, eu_, T * k * I, c.situ_beta, c.situ_linear_beta, st)
          : cuda::SiluGlu(eg_, eg_, eu_, T * k * I, st));
  KIMI_RETURN_IF_ERROR(grouped(res_, D, eg_, I, w.experts_down));
  if (m.latent_dim > 0) {
    KIMI_RETURN_IF_ERROR(cuda::MoeCombine(ycomb_, res_, ids_, route_w_, row_of_, T, k, D, st));
    if (m.latent_norm) {
      KIMI_RETURN_IF_ERROR(cuda::RmsNorm(ycomb_, ycomb_, w.latent_norm, T, D, c.rms_eps, st));
    }
    KIMI_RETURN_IF_ERROR(Linear(out, d, ycomb_, D, w.latent_up, T, st));
  } else {
    KIMI_RETURN_IF_ERROR(cuda::MoeCombine(out, res_, ids_, route_w_, row_of_, T, k, D, st));
  }
  if (w.shared.gate.data) {
    KIMI_RETURN_IF_ERROR(Mlp(w.shared, x, shared_, T, st));
    KIMI_RETURN_IF_ERROR(cuda::AddInPlace(out, shared_, T * d, st));
  }
  return absl::OkStatus();
}

}  // namespace kimi::gpu
