// Per-request state in device memory, laid out exactly like the host pools of engine/state.h so a
// slot or a page means the same bytes on both sides:
//   KDA:  slot-major [slots][kda layers][recurrent H*K*V | conv 3 * (W-1) * P] fp32
//   MLA:  [mla layers][num_pages][page_size][kv_lora_rank + qk_rope_head_dim] fp32
// plus the state operations the scheduler asks for (clear, snapshot to host memory, restore,
// drop), applied on the runner's stream.
//
// Thread contract: the engine thread only (the same thread that runs steps).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/state_store.h"
#include "kernels/cuda/device_buffer.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::gpu {

class DeviceState {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceState>> Create(const ModelConfig& config,
                                                             int64_t slots, int64_t pages,
                                                             int64_t page_size);

  int64_t num_slots() const { return slots_; }
  int64_t num_pages() const { return pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t slot_floats() const { return kda_layers_ * per_layer_; }
  int64_t kda_per_layer() const { return per_layer_; }
  int64_t kda_recurrent() const { return recurrent_; }
  int64_t kv_width() const { return width_; }
  // KDA layer `i`'s state of slot 0; slot s is slot_floats() further.
  float* Kda(int64_t kda_layer) const { return kda_.as<float>() + kda_layer * per_layer_; }
  // MLA layer `i`'s pool [num_pages, page_size, width].
  float* Kv(int64_t mla_layer) const {
    return kv_.as<float>() + mla_layer * pages_ * page_size_ * width_;
  }

  // Applies one state op (engine/state_store.h) and waits for it. Out-of-range slots or pages and
  // unknown handles are InvalidArgument, with nothing changed.
  absl::Status Apply(const StateOp& op, cudaStream_t stream);
  int64_t snapshot_bytes() const { return snapshot_bytes_; }

 private:
  DeviceState() = default;
  absl::Status CheckSlot(int64_t slot) const;
  absl::Status CheckPages(const std::vector<int32_t>& pages) const;

  int64_t slots_ = 0, pages_ = 0, page_size_ = 0;
  int64_t kda_layers_ = 0, mla_layers_ = 0, recurrent_ = 0, per_layer_ = 0, width_ = 0;
  cuda::DeviceBuffer kda_, kv_;
  std::unordered_map<int64_t, std::vector<float>> snapshots_;
  int64_t snapshot_bytes_ = 0;
};

}  // namespace kimi::gpu
