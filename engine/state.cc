#include "engine/state.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace kimi {

ZeroedBuffer::ZeroedBuffer(int64_t floats) : floats_(floats) {
  if (floats == 0) return;
  void* p = ::mmap(nullptr, static_cast<size_t>(floats) * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();  // like any allocation that cannot be satisfied
  data_ = static_cast<float*>(p);
}

ZeroedBuffer::~ZeroedBuffer() {
  if (data_) ::munmap(data_, static_cast<size_t>(floats_) * sizeof(float));
}

namespace {

// Floats of one layer's recurrent state (a bf16 state two values a float, rounded up: every
// checkpoint's heads are 128 x 128).
int64_t RecurrentFloats(const ModelConfig& c) {
  const int64_t values = c.kda.num_heads * c.kda.head_dim * c.kda.head_dim;
  return c.kda.state_dtype == KdaStateDtype::kBf16 ? (values + 1) / 2 : values;
}

int64_t LayerFloatsOf(const ModelConfig& c) {
  return RecurrentFloats(c) + 3 * (c.kda.conv_kernel - 1) * c.kda.projection();
}

}  // namespace

KdaStatePool::KdaStatePool(const ModelConfig& c, int64_t num_slots)
    : dtype_(c.kda.state_dtype),
      num_slots_(num_slots),
      layers_(c.StageLayersOf(LayerKind::kKda)),
      recurrent_(RecurrentFloats(c)),
      per_layer_(LayerFloatsOf(c)),
      data_(num_slots * layers_ * per_layer_) {}

int64_t KdaStatePool::SlotBytes(const ModelConfig& c) {
  return c.StageLayersOf(LayerKind::kKda) * LayerFloatsOf(c) * static_cast<int64_t>(sizeof(float));
}

void KdaStatePool::Clear(int64_t slot) {
  std::fill_n(data_.data() + slot * SlotFloats(), SlotFloats(), 0.0f);
}

void KdaStatePool::CopySlot(int64_t from, int64_t to) {
  std::memcpy(data_.data() + to * SlotFloats(), data_.data() + from * SlotFloats(),
              SlotFloats() * sizeof(float));
}

void KdaStatePool::SaveSlot(int64_t slot, float* out) const {
  std::memcpy(out, data_.data() + slot * SlotFloats(), SlotFloats() * sizeof(float));
}

void KdaStatePool::LoadSlot(int64_t slot, const float* in) {
  std::memcpy(data_.data() + slot * SlotFloats(), in, SlotFloats() * sizeof(float));
}

MlaKvCache::MlaKvCache(const ModelConfig& c, int64_t num_pages, int64_t page_size)
    : layers_(c.StageLayersOf(LayerKind::kMla)),
      num_pages_(num_pages),
      page_size_(page_size),
      width_(c.mla.cache_width()),
      data_(layers_ * num_pages * page_size * width_) {}

int64_t MlaKvCache::BytesPerToken(const ModelConfig& c) {
  return c.StageLayersOf(LayerKind::kMla) * c.mla.cache_width() *
         static_cast<int64_t>(sizeof(float));
}

void MlaKvCache::CopyPage(int32_t from, int32_t to) {
  const int64_t page = page_size_ * width_;
  for (int64_t l = 0; l < layers_; ++l) {
    float* pool = LayerPool(l);
    std::memcpy(pool + to * page, pool + from * page, page * sizeof(float));
  }
}

int64_t AttnResCacheBytes(const ModelConfig& c, int64_t tokens) {
  return tokens * c.AttnResBankRows() * c.hidden * static_cast<int64_t>(sizeof(float));
}

}  // namespace kimi
