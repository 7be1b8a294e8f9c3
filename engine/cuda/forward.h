// Private to engine/cuda: one forward step on the GPU, enqueued on a stream (engine/engine.cc's
// RunStage, layer for layer, with device kernels). Every per-step input lives in device memory at
// fixed addresses -- the plan (token ids, per-sequence offsets, slots, positions, page tables,
// logit rows) and the activation buffers -- so the same enqueue can be captured into a CUDA graph
// and replayed with a new plan; host values it depends on are in StepShape.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/device_state.h"
#include "kernels/cuda/batch.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::gpu {

// Host-side facts one enqueued step depends on (a captured graph fixes them).
struct StepShape {
  int64_t tokens = 0;
  int64_t seqs = 0;
  int64_t logit_rows = 0;
  bool has_decode = false;   // some sequence has one token: the fused KDA decode kernel
  bool has_prefill = false;  // some sequence has more: the chunked KDA path
};

// The step's plan as int32 arrays (host staging or device copy), at fixed offsets.
struct PlanArrays {
  int32_t* tokens = nullptr;      // [tokens]
  int32_t* tok_seq = nullptr;     // [tokens]
  int32_t* tok_pos = nullptr;     // [tokens]
  int32_t* logit_rows = nullptr;  // [logit rows] token rows that get logits, in output order
  int32_t* seq_offset = nullptr;  // [seqs]
  int32_t* seq_count = nullptr;
  int32_t* seq_pos0 = nullptr;
  int32_t* seq_slot = nullptr;
  int32_t* seq_page_start = nullptr;
  int32_t* pages = nullptr;       // [page entries]
};

class Forward {
 public:
  Forward(const DeviceModel& model, DeviceState& state, cuda::Gemm& gemm,
          cuda::GemmPrecision precision);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // Makes room for steps of up to these sizes. `*moved` is set when buffers were reallocated
  // (graphs captured before then are stale).
  absl::Status Reserve(int64_t tokens, int64_t seqs, int64_t page_entries, int64_t logit_rows,
                       bool* moved);
  int64_t token_capacity() const { return cap_tokens_; }
  int64_t seq_capacity() const { return cap_seqs_; }
  int64_t page_capacity() const { return cap_pages_; }
  int64_t logit_capacity() const { return cap_logits_; }

  // Fill the host plan, then upload it (asynchronously, on `stream`) before Enqueue.
  const PlanArrays& host_plan() const { return host_; }
  absl::Status UploadPlan(cudaStream_t stream);

  // Enqueues the whole step: embeddings, every layer, final norm and lm_head on the logit rows.
  absl::Status Enqueue(const StepShape& shape, cudaStream_t stream);
  // [logit rows, vocab] fp32, valid after the stream reaches the end of the step.
  const float* logits() const { return logits_; }

 private:
  absl::Status Kda(const DeviceLayer& L, int64_t kda_index, const StepShape& s, cudaStream_t st);
  absl::Status Mla(const DeviceLayer& L, int64_t mla_index, const StepShape& s, cudaStream_t st);
  absl::Status Mlp(const DeviceMlp& w, const float* x, float* out, int64_t rows, cudaStream_t st);
  absl::Status Moe(const DeviceMoe& w, const float* x, float* out, int64_t rows, cudaStream_t st);
  absl::Status Linear(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                      int64_t m, cudaStream_t st);
  cuda::DeviceBatch Batch(const StepShape& s) const;

  const DeviceModel& model_;
  DeviceState& state_;
  cuda::Gemm& gemm_;
  cuda::GemmPrecision precision_;
  int64_t cap_tokens_ = 0, cap_seqs_ = 0, cap_pages_ = 0, cap_logits_ = 0;
  cuda::DeviceBuffer arena_;      // activations and scratch
  cuda::DeviceBuffer plan_dev_;   // the plan on the device
  int32_t* plan_host_mem_ = nullptr;  // pinned staging of the plan
  int64_t plan_ints_ = 0;
  PlanArrays host_, dev_;

  // Activations [tokens, ...] (see forward.cc for the widths).
  float *hidden_ = nullptr, *normed_ = nullptr, *y_ = nullptr, *mix_ = nullptr, *bank_ = nullptr;
  // KDA sublayer.
  float *q_raw_ = nullptr, *k_raw_ = nullptr, *v_raw_ = nullptr, *g_raw_ = nullptr, *gate_ = nullptr;
  float *q_c_ = nullptr, *k_c_ = nullptr, *v_c_ = nullptr, *g_ = nullptr, *o_ = nullptr;
  float *low_ = nullptr, *gate_low_ = nullptr, *beta_raw_ = nullptr, *beta_ = nullptr;
  float* chunk_ws_ = nullptr;
  int64_t chunk_ws_floats_ = 0;
  // MLA sublayer.
  float *latent_ = nullptr, *cq_ = nullptr, *q_ = nullptr, *qa_ = nullptr, *o_lat_ = nullptr;
  float *mo_ = nullptr, *mgate_ = nullptr;
  // FFN sublayer (dense and shared experts; MoE).
  float *fg_ = nullptr, *fu_ = nullptr;
  float *router_ = nullptr, *route_w_ = nullptr, *z_ = nullptr, *xs_ = nullptr, *eg_ = nullptr;
  float *eu_ = nullptr, *res_ = nullptr, *ycomb_ = nullptr, *shared_ = nullptr;
  int32_t *ids_ = nullptr, *expert_offset_ = nullptr, *sorted_token_ = nullptr, *row_of_ = nullptr;
  int32_t *tile_group_ = nullptr, *tile_row0_ = nullptr, *tile_row_end_ = nullptr,
          *num_tiles_ = nullptr;
  // Output.
  float *picked_ = nullptr, *logits_ = nullptr;
};

}  // namespace kimi::gpu
