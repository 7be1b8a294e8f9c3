#include "engine/state_store.h"

#include <algorithm>
#include <cassert>

namespace kimi {

void StateStore::Apply(const StateOp& op) {
  auto account = [&](const std::vector<float>& v, int sign) {
    bytes_ += sign * static_cast<int64_t>(v.size() * sizeof(float));
  };
  switch (op.kind) {
    case StateOpKind::kClearSlot:
      if (kda_) kda_->Clear(op.slot);
      return;
    case StateOpKind::kSaveSlot: {
      std::vector<float>& v = snapshots_[op.handle];
      account(v, -1);
      v.assign(kda_ ? kda_->SlotFloats() : 0, 0.0f);
      if (kda_) kda_->SaveSlot(op.slot, v.data());
      account(v, +1);
      return;
    }
    case StateOpKind::kLoadSlot: {
      auto it = snapshots_.find(op.handle);
      assert(it != snapshots_.end() && "load of an unknown snapshot");
      if (kda_ && it != snapshots_.end()) kda_->LoadSlot(op.slot, it->second.data());
      return;
    }
    case StateOpKind::kSavePages: {
      std::vector<float>& v = snapshots_[op.handle];
      account(v, -1);
      v.clear();
      if (kv_) {
        const int64_t page_floats = kv_->page_size() * kv_->width();
        for (int64_t l = 0; l < kv_->layers(); ++l) {
          for (int32_t p : op.pages) {
            const float* src = kv_->LayerPool(l) + p * page_floats;
            v.insert(v.end(), src, src + page_floats);
          }
        }
      }
      account(v, +1);
      return;
    }
    case StateOpKind::kLoadPages: {
      auto it = snapshots_.find(op.handle);
      assert(it != snapshots_.end() && "load of unknown pages");
      if (!kv_ || it == snapshots_.end()) return;
      const int64_t page_floats = kv_->page_size() * kv_->width();
      const float* in = it->second.data();
      for (int64_t l = 0; l < kv_->layers(); ++l) {
        for (int32_t p : op.pages) {
          std::copy_n(in, page_floats, kv_->LayerPool(l) + p * page_floats);
          in += page_floats;
        }
      }
      return;
    }
    case StateOpKind::kDrop: {
      auto it = snapshots_.find(op.handle);
      if (it != snapshots_.end()) {
        account(it->second, -1);
        snapshots_.erase(it);
      }
      return;
    }
  }
}

}  // namespace kimi
