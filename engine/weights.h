// The model's weights, bound by name from a checkpoint. Matrices are views (Weight) of the
// checkpoint's memory in their stored format: by default a huge-page copy of the files, packed for
// the kernels (engine/safetensors.h, kernels/cpu/pack.h); mapped files where the copy would not fit
// or was not asked for, a rank's own matrices copied out of them (Options::copy_shard). Small
// vectors (norms, biases, gates, conv taps) are converted to fp32 once at load. Immutable after
// load.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/parallel.h"
#include "engine/safetensors.h"
#include "kernels/weight.h"

namespace kimi {

struct MlpWeights {  // gated MLP: down(act(gate x) * up x)
  Weight gate, up, down;
};

struct KdaWeights {
  Weight q_proj, k_proj, v_proj;
  const float* q_conv = nullptr;  // [P, W] each
  const float* k_conv = nullptr;
  const float* v_conv = nullptr;
  Weight f_a, f_b;    // decay gate, low rank
  Weight b_proj;      // beta
  Weight g_a, g_b;    // output gate, low rank (Kimi Linear)
  Weight g_proj;      // output gate, full rank (K3)
  const float* a_log = nullptr;    // [H]
  const float* dt_bias = nullptr;  // [P]
  const float* o_norm = nullptr;   // [head_dim]
  Weight o_proj;
};

struct MlaWeights {
  Weight q_proj;                            // without q-LoRA
  Weight q_a_proj, q_b_proj;                // with q-LoRA
  const float* q_a_norm = nullptr;
  Weight kv_a_proj;                         // [rank + rope, hidden]
  const float* kv_a_norm = nullptr;
  Weight kv_b_proj;                         // [H * (nope + v), rank]
  Weight uk_t;                              // [H * rank, nope]: each head's W_UK (the first
                                            // nope rows of its kv_b_proj block) transposed, built
                                            // at load so absorbing q is one MatMul per head
  Weight g_proj;                            // output gate (K3)
  Weight o_proj;
};

struct MoeWeights {
  Weight router;                    // [E, hidden]
  const float* bias = nullptr;      // e_score_correction_bias [E]
  Weight latent_down, latent_up;    // Latent MoE (K3)
  const float* latent_norm = nullptr;
  std::vector<MlpWeights> experts;  // w1 = gate, w3 = up, w2 = down
  MlpWeights shared;                // shared.gate.data == nullptr when there is none
};

struct LayerWeights {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  const float* attn_res_attn = nullptr;  // folded res_norm * res_proj [hidden], K3
  const float* attn_res_mlp = nullptr;
  KdaWeights kda;
  MlaWeights mla;
  bool is_moe = false;
  MlpWeights mlp;
  MoeWeights moe;
};

struct ModelWeights {
  Weight embed;     // first pipeline stage only
  Weight lm_head;   // last stage: this rank's vocabulary rows
  int64_t lm_head_rows_per_rank = 0;  // vocabulary chunk per rank of the stage (the last may be short)
  const float* final_norm = nullptr;
  const float* attn_res_out = nullptr;  // folded output_attn_res_norm * proj, K3
  std::vector<LayerWeights> layers;
};

// A loaded model: config, the open checkpoint (owning the maps), bound weights.
class Model {
 public:
  struct Options {
    // Receives one line per note (skipped tensors, defaults taken) and progress during load.
    std::function<void(const std::string&)> log;
    // Where the weights live (see engine/safetensors.h).
    WeightMemory memory = DefaultWeightMemory();
    // Sharding: this process is `rank` of `layout` and binds only its piece (whole model: 1x1x1).
    ParallelLayout layout;
    int rank = 0;
    // With a mapped checkpoint (kMap, kMapHuge): copy the matrices this rank multiplies by (its
    // stage's layers, its rows of a tensor-parallel split, its own experts) out of the mapping
    // into huge pages and pack them, as kCopyHuge does for a whole model. The rest (other ranks'
    // experts, which expert replication may still read) stays mapped.
    bool copy_shard = false;
  };
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, const Options& opts);
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir) {
    return Load(dir, Options{});
  }

  // The model as this rank runs it (heads and widths divided by tp, its stage's layers); in one
  // process, the whole model.
  const ModelConfig& config() const { return config_; }
  // The model as the checkpoint describes it.
  const ModelConfig& full_config() const { return full_config_; }
  const Shard& shard() const { return shard_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& dir() const { return dir_; }
  // Serves fewer tokens per request than the model supports (a deployment choice).
  void LimitContext(int64_t tokens) { config_.max_context = full_config_.max_context = tokens; }
  // Keeps the KDA state pools' recurrent states in `dtype` (a serving choice, as above).
  void SetKdaStateDtype(KdaStateDtype dtype) {
    config_.kda.state_dtype = full_config_.kda.state_dtype = dtype;
  }
  // Bytes of weights one decode token reads (active experts at their stored size).
  int64_t ActiveWeightBytes() const;
  // The memory holding the checkpoint's bytes (benchmarks stream it as their bandwidth baseline).
  std::vector<std::span<const uint8_t>> WeightRegions() const { return checkpoint_->Regions(); }

 private:
  Model() = default;
  absl::Status Bind(const Options& opts);
  // Every matrix MatMul reads (once per view); with `own_experts_only`, of the routed experts only
  // those this rank owns under expert parallelism.
  std::vector<Weight*> Matrices(bool own_experts_only);
  // Rewrites `matrices`, which must be in private writable memory, into the packed layout
  // (kernels/cpu/pack.h); returns the bytes packed.
  int64_t PackMatrices(const std::vector<Weight*>& matrices);
  // Options::copy_shard: the rank's mapped matrices into shard_pages_, then packed; returns the
  // bytes copied. `log` (optional) receives the progress of a long copy.
  absl::StatusOr<int64_t> CopyShardMatrices(const std::function<void(const std::string&)>& log);
  const float* Vec(const TensorInfo& t, int64_t count = -1);
  const float* Fold(const float* a, const float* b, int64_t n);
  // A copy of columns [begin, begin + count) (MXFP4: whole 32-column blocks).
  Weight SliceColumns(const Weight& w, int64_t begin, int64_t count);
  Weight TransposeUk(const Weight& kv_b);

  std::string dir_;
  ModelConfig full_config_;
  ModelConfig config_;
  Shard shard_;
  // Matrices made at load (column slices, uk_t) start on a cache line, as the checkpoint's own do
  // (the kernels read weights in 64-byte blocks).
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  using OwnedMatrix = std::unique_ptr<uint8_t[], FreeDeleter>;
  uint8_t* NewMatrix(int64_t bytes);

  std::vector<OwnedMatrix> owned_matrices_;  // column slices, uk_t
  std::unique_ptr<Checkpoint> checkpoint_;
  HugePages shard_pages_;  // Options::copy_shard: this rank's matrices
  ModelWeights weights_;
  std::vector<std::unique_ptr<float[]>> owned_;  // fp32 copies of small vectors
};

}  // namespace kimi
