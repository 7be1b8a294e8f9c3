// Per-request state the forward pass reads and writes, held in pools the scheduler sizes and
// assigns. The engine never owns a request's state: it receives slot and page indices per step.
//
//   KdaStatePool: one slot per running request; per KDA layer the recurrent state [H, K, V]
//                 (fp32, or bf16 with KdaConfig::state_dtype) and the fp32 conv history
//                 [3 (q,k,v), W-1, P].
//   MlaKvCache:   pages of `page_size` positions; per MLA layer [num_pages, page_size, width],
//                 width = kv_lora_rank + qk_rope_head_dim (normalised latent, then k_pe).
//
// Pools hold the layers of this process's stage only (ModelConfig::StageLayersOf), and, under
// tensor parallelism, this rank's heads (the config given is the rank's ShardConfig).
//
// Thread contract: the pools are plain memory; the engine thread writes them during Step(), the
// scheduler copies slots between steps. Copies are explicit calls so their cost is visible.
#pragma once

#include <cassert>
#include <cstdint>
#include <memory>

#include "engine/model_config.h"

namespace kimi {

// Zero-initialised memory whose pages are committed on first touch (an anonymous mapping), so a
// large pool costs nothing until requests use it.
class ZeroedBuffer {
 public:
  explicit ZeroedBuffer(int64_t floats);
  ~ZeroedBuffer();
  ZeroedBuffer(const ZeroedBuffer&) = delete;
  ZeroedBuffer& operator=(const ZeroedBuffer&) = delete;
  float* data() const { return data_; }
  int64_t size() const { return floats_; }

 private:
  float* data_ = nullptr;
  int64_t floats_ = 0;
};

class KdaStatePool {
 public:
  KdaStatePool(const ModelConfig& config, int64_t num_slots);

  int64_t num_slots() const { return num_slots_; }
  KdaStateDtype state_dtype() const { return dtype_; }
  // Floats per slot (all KDA layers, recurrent + conv; a bf16 recurrent state counts two values a
  // float): the unit of the slot copies below.
  int64_t SlotFloats() const { return layers_ * per_layer_; }
  static int64_t SlotBytes(const ModelConfig& config);

  // Floats of one slot's one KDA layer: the recurrent state, then the conv history, contiguous.
  int64_t LayerFloats() const { return per_layer_; }
  const void* Layer(int64_t slot, int64_t kda_layer) { return Base(slot, kda_layer); }
  // The recurrent state of a pool of each dtype.
  float* Recurrent(int64_t slot, int64_t kda_layer) {
    assert(dtype_ == KdaStateDtype::kF32);
    return Base(slot, kda_layer);
  }
  uint16_t* RecurrentBf16(int64_t slot, int64_t kda_layer) {
    assert(dtype_ == KdaStateDtype::kBf16);
    return reinterpret_cast<uint16_t*>(Base(slot, kda_layer));
  }
  float* Conv(int64_t slot, int64_t kda_layer) { return Base(slot, kda_layer) + recurrent_; }
  // Zeroes a slot: the state of an empty sequence.
  void Clear(int64_t slot);
  // Explicit copies, for prefix-cache snapshots and swapping to host memory.
  void CopySlot(int64_t from, int64_t to);
  void SaveSlot(int64_t slot, float* out) const;
  void LoadSlot(int64_t slot, const float* in);

 private:
  float* Base(int64_t slot, int64_t kda_layer) {
    return data_.data() + (slot * layers_ + kda_layer) * per_layer_;
  }
  KdaStateDtype dtype_;
  int64_t num_slots_, layers_, recurrent_, per_layer_;  // recurrent_: floats (bf16 in pairs)
  ZeroedBuffer data_;
};

class MlaKvCache {
 public:
  MlaKvCache(const ModelConfig& config, int64_t num_pages, int64_t page_size);

  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  int64_t layers() const { return layers_; }
  int64_t width() const { return width_; }
  static int64_t BytesPerToken(const ModelConfig& config);
  // [num_pages, page_size, width] of one MLA layer.
  float* LayerPool(int64_t mla_layer) {
    return data_.data() + mla_layer * num_pages_ * page_size_ * width_;
  }
  // Copies one page's rows in every MLA layer (prefix-cache copy-on-write).
  void CopyPage(int32_t from, int32_t to);

 private:
  int64_t layers_, num_pages_, page_size_, width_;
  ZeroedBuffer data_;
};

// Bytes of the AttnRes block cache for `tokens` tokens in flight (0 without AttnRes).
int64_t AttnResCacheBytes(const ModelConfig& config, int64_t tokens);

}  // namespace kimi
