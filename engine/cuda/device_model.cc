#include "engine/cuda/device_model.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/pack.h"
#include "kernels/cuda/check.h"

namespace kimi::gpu {

void RowMajorBytes(const Weight& w, std::vector<uint8_t>* data, std::vector<uint8_t>* scales) {
  // The CPU loader may have packed the weight in place (kernels/cpu/pack.h).
  data->assign(w.DataBytes(), 0);
  scales->assign(w.ScaleBytes(), 0);
  cpu::CopyRowMajor(w, data->data(), scales->data());
}

absl::StatusOr<void*> DeviceModel::Put(const void* data, int64_t bytes) {
  absl::StatusOr<cuda::DeviceBuffer> b = cuda::DeviceBuffer::Allocate(bytes);
  if (!b.ok()) return b.status();
  KIMI_RETURN_IF_ERROR(cuda::CopyToDevice(b->get(), data, bytes));
  bytes_ += bytes;
  buffers_.push_back(std::move(*b));
  return buffers_.back().get();
}

absl::StatusOr<const float*> DeviceModel::Vector(const float* host, int64_t n) {
  if (!host) return static_cast<const float*>(nullptr);
  absl::StatusOr<void*> p = Put(host, n * 4);
  if (!p.ok()) return p.status();
  return static_cast<const float*>(*p);
}

absl::StatusOr<Weight> DeviceModel::Matrix(const Weight& host) {
  if (!host.data) return Weight{};
  return Stack({&host});
}

absl::StatusOr<Weight> DeviceModel::Stack(const std::vector<const Weight*>& parts) {
  const Weight& first = *parts[0];
  for (const Weight* w : parts) {
    if (!w->data || w->format != first.format || w->rows != first.rows || w->cols != first.cols) {
      return absl::InvalidArgumentError("DeviceModel: routed experts differ in format or shape");
    }
  }
  Weight out = first;
  out.packed = false;
  out.layout = PackLayout::kBlocks;
  out.rows = first.rows * static_cast<int64_t>(parts.size());
  const int64_t db = first.DataBytes(), sb = first.ScaleBytes();
  std::vector<uint8_t> data(db * parts.size()), scales(sb * parts.size()), d, s;
  for (size_t i = 0; i < parts.size(); ++i) {
    RowMajorBytes(*parts[i], &d, &s);
    std::memcpy(data.data() + i * db, d.data(), db);
    if (sb) std::memcpy(scales.data() + i * sb, s.data(), sb);
  }
  absl::StatusOr<void*> dp = Put(data.data(), static_cast<int64_t>(data.size()));
  if (!dp.ok()) return dp.status();
  out.data = *dp;
  out.scales = nullptr;
  if (sb) {
    absl::StatusOr<void*> sp = Put(scales.data(), static_cast<int64_t>(scales.size()));
    if (!sp.ok()) return sp.status();
    out.scales = static_cast<const uint8_t*>(*sp);
  }
  if (out.cols > max_cols_) max_cols_ = out.cols;
  return out;
}

absl::StatusOr<std::unique_ptr<DeviceModel>> DeviceModel::Upload(const Model& model) {
  const ModelConfig& c = model.config();
  const Shard& sh = model.shard();
  if (!sh.layout.single() || sh.first_layer != 0 || sh.end_layer != c.num_layers) {
    return absl::UnimplementedError(
        absl::StrCat("CUDA runner: sharded models are not supported yet (", sh.Describe(), ")"));
  }
  std::unique_ptr<DeviceModel> m(new DeviceModel);
  m->config_ = c;
  const ModelWeights& w = model.weights();
#define KIMI_ASSIGN(lhs, expr)             \
  do {                                     \
    auto kimi_v_ = (expr);                 \
    if (!kimi_v_.ok()) return kimi_v_.status(); \
    lhs = *kimi_v_;                        \
  } while (0)
  KIMI_ASSIGN(m->embed_, m->Matrix(w.embed));
  if (w.lm_head.data == w.embed.data && w.lm_head.rows == w.embed.rows) {
    m->lm_head_ = m->embed_;
  } else {
    KIMI_ASSIGN(m->lm_head_, m->Matrix(w.lm_head));
  }
  KIMI_ASSIGN(m->final_norm_, m->Vector(w.final_norm, c.hidden));
  KIMI_ASSIGN(m->attn_res_out_, m->Vector(w.attn_res_out, c.hidden));
  const int64_t d = c.hidden, P = c.kda.projection(), W = c.kda.conv_kernel;
  m->layers_.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    DeviceLayer& D = m->layers_[l];
    KIMI_ASSIGN(D.input_norm, m->Vector(L.input_norm, d));
    KIMI_ASSIGN(D.post_norm, m->Vector(L.post_norm, d));
    KIMI_ASSIGN(D.attn_res_attn, m->Vector(L.attn_res_attn, d));
    KIMI_ASSIGN(D.attn_res_mlp, m->Vector(L.attn_res_mlp, d));
    if (c.layer_kinds[l] == LayerKind::kKda) {
      const KdaWeights& k = L.kda;
      DeviceKda& K = D.kda;
      KIMI_ASSIGN(K.q_proj, m->Matrix(k.q_proj));
      KIMI_ASSIGN(K.k_proj, m->Matrix(k.k_proj));
      KIMI_ASSIGN(K.v_proj, m->Matrix(k.v_proj));
      KIMI_ASSIGN(K.f_a, m->Matrix(k.f_a));
      KIMI_ASSIGN(K.f_b, m->Matrix(k.f_b));
      KIMI_ASSIGN(K.b_proj, m->Matrix(k.b_proj));
      KIMI_ASSIGN(K.g_a, m->Matrix(k.g_a));
      KIMI_ASSIGN(K.g_b, m->Matrix(k.g_b));
      KIMI_ASSIGN(K.g_proj, m->Matrix(k.g_proj));
      KIMI_ASSIGN(K.o_proj, m->Matrix(k.o_proj));
      KIMI_ASSIGN(K.q_conv, m->Vector(k.q_conv, P * W));
      KIMI_ASSIGN(K.k_conv, m->Vector(k.k_conv, P * W));
      KIMI_ASSIGN(K.v_conv, m->Vector(k.v_conv, P * W));
      KIMI_ASSIGN(K.a_log, m->Vector(k.a_log, c.kda.num_heads));
      KIMI_ASSIGN(K.dt_bias, m->Vector(k.dt_bias, P));
      KIMI_ASSIGN(K.o_norm, m->Vector(k.o_norm, c.kda.head_dim));
    } else {
      const MlaWeights& a = L.mla;
      DeviceMla& A = D.mla;
      KIMI_ASSIGN(A.q_proj, m->Matrix(a.q_proj));
      KIMI_ASSIGN(A.q_a_proj, m->Matrix(a.q_a_proj));
      KIMI_ASSIGN(A.q_b_proj, m->Matrix(a.q_b_proj));
      KIMI_ASSIGN(A.kv_a_proj, m->Matrix(a.kv_a_proj));
      KIMI_ASSIGN(A.kv_b_proj, m->Matrix(a.kv_b_proj));
      KIMI_ASSIGN(A.uk_t, m->Matrix(a.uk_t));
      KIMI_ASSIGN(A.g_proj, m->Matrix(a.g_proj));
      KIMI_ASSIGN(A.o_proj, m->Matrix(a.o_proj));
      KIMI_ASSIGN(A.q_a_norm, m->Vector(a.q_a_norm, c.mla.q_lora_rank));
      KIMI_ASSIGN(A.kv_a_norm, m->Vector(a.kv_a_norm, c.mla.kv_lora_rank));
    }
    D.is_moe = L.is_moe;
    if (!L.is_moe) {
      KIMI_ASSIGN(D.mlp.gate, m->Matrix(L.mlp.gate));
      KIMI_ASSIGN(D.mlp.up, m->Matrix(L.mlp.up));
      KIMI_ASSIGN(D.mlp.down, m->Matrix(L.mlp.down));
      continue;
    }
    const MoeWeights& e = L.moe;
    DeviceMoe& E = D.moe;
    KIMI_ASSIGN(E.router, m->Matrix(e.router));
    KIMI_ASSIGN(E.bias, m->Vector(e.bias, c.moe.num_experts));
    KIMI_ASSIGN(E.latent_down, m->Matrix(e.latent_down));
    KIMI_ASSIGN(E.latent_up, m->Matrix(e.latent_up));
    KIMI_ASSIGN(E.latent_norm, m->Vector(e.latent_norm, c.ExpertDim()));
    std::vector<const Weight*> gate, up, down;
    for (const MlpWeights& x : e.experts) {
      gate.push_back(&x.gate);
      up.push_back(&x.up);
      down.push_back(&x.down);
    }
    if (gate.empty()) return absl::InvalidArgumentError("DeviceModel: MoE layer without experts");
    KIMI_ASSIGN(E.experts_gate, m->Stack(gate));
    KIMI_ASSIGN(E.experts_up, m->Stack(up));
    KIMI_ASSIGN(E.experts_down, m->Stack(down));
    E.expert_rows = e.experts[0].gate.rows;
    KIMI_ASSIGN(E.shared.gate, m->Matrix(e.shared.gate));
    KIMI_ASSIGN(E.shared.up, m->Matrix(e.shared.up));
    KIMI_ASSIGN(E.shared.down, m->Matrix(e.shared.down));
  }
#undef KIMI_ASSIGN
  return m;
}

}  // namespace kimi::gpu
