// A loaded Model's weights in device memory, bound the same way engine/weights.h binds them on the
// host: matrices as stored (bf16 uploaded as bf16, MXFP4 experts uploaded packed as
// weight_packed + weight_scale -- never dequantised), small vectors as fp32. Each MoE layer's
// routed experts are stacked into one [E * rows, cols] matrix per projection so the grouped GEMM
// finds expert e at rows [e * rows, (e + 1) * rows). Immutable after upload.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/weights.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/weight.h"

namespace kimi::gpu {

// Every Weight below holds device pointers (row-major, packed = false).
struct DeviceKda {
  Weight q_proj, k_proj, v_proj, f_a, f_b, b_proj, g_a, g_b, g_proj, o_proj;
  const float* q_conv = nullptr;  // [P, W]
  const float* k_conv = nullptr;
  const float* v_conv = nullptr;
  const float* a_log = nullptr;    // [H]
  const float* dt_bias = nullptr;  // [P]
  const float* o_norm = nullptr;   // [head_dim]
};

struct DeviceMla {
  Weight q_proj, q_a_proj, q_b_proj, kv_a_proj, kv_b_proj, uk_t, g_proj, o_proj;
  const float* q_a_norm = nullptr;
  const float* kv_a_norm = nullptr;
};

struct DeviceMlp {
  Weight gate, up, down;
};

struct DeviceMoe {
  Weight router;
  const float* bias = nullptr;
  Weight latent_down, latent_up;
  const float* latent_norm = nullptr;
  // Routed experts stacked: gate, up [E * I, D]; down [E * D, I].
  Weight experts_gate, experts_up, experts_down;
  int64_t expert_rows = 0;  // I
  DeviceMlp shared;         // shared.gate.data == nullptr when there is none
};

struct DeviceLayer {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  const float* attn_res_attn = nullptr;
  const float* attn_res_mlp = nullptr;
  DeviceKda kda;
  DeviceMla mla;
  bool is_moe = false;
  DeviceMlp mlp;
  DeviceMoe moe;
};

// Host row-major bytes of `w` (data, and scales for MXFP4): as stored, or unpacked when the CPU
// loader packed the weight in place (kernels/cpu/pack.h). What DeviceModel uploads.
void RowMajorBytes(const Weight& w, std::vector<uint8_t>* data, std::vector<uint8_t>* scales);

class DeviceModel {
 public:
  // Uploads `model` to the current CUDA device. The whole model in one process only (no tensor,
  // expert or pipeline shards): anything else is Unimplemented.
  static absl::StatusOr<std::unique_ptr<DeviceModel>> Upload(const Model& model);

  const ModelConfig& config() const { return config_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const Weight& embed() const { return embed_; }
  const Weight& lm_head() const { return lm_head_; }
  const float* final_norm() const { return final_norm_; }
  const float* attn_res_out() const { return attn_res_out_; }
  int64_t bytes() const { return bytes_; }
  // The widest input of any matrix the step multiplies (sizes the GEMM's activation copies).
  int64_t max_gemm_cols() const { return max_cols_; }

 private:
  DeviceModel() = default;
  absl::StatusOr<Weight> Matrix(const Weight& host);
  absl::StatusOr<Weight> Stack(const std::vector<const Weight*>& parts);
  absl::StatusOr<const float*> Vector(const float* host, int64_t n);
  absl::StatusOr<void*> Put(const void* data, int64_t bytes);

  ModelConfig config_;
  std::vector<DeviceLayer> layers_;
  Weight embed_, lm_head_;
  const float* final_norm_ = nullptr;
  const float* attn_res_out_ = nullptr;
  std::vector<cuda::DeviceBuffer> buffers_;
  int64_t bytes_ = 0;
  int64_t max_cols_ = 0;
};

}  // namespace kimi::gpu
