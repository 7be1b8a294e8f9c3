#include "engine/cuda/device_state.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"

namespace kimi::gpu {

absl::StatusOr<std::unique_ptr<DeviceState>> DeviceState::Create(const ModelConfig& c,
                                                                 int64_t slots, int64_t pages,
                                                                 int64_t page_size) {
  if (slots < 0 || pages < 0 || page_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceState: ", slots, " slots, ", pages,
                                                   " pages of ", page_size));
  }
  std::unique_ptr<DeviceState> s(new DeviceState);
  s->slots_ = slots;
  s->pages_ = pages;
  s->page_size_ = page_size;
  s->kda_layers_ = c.StageLayersOf(LayerKind::kKda);
  s->mla_layers_ = c.StageLayersOf(LayerKind::kMla);
  s->recurrent_ = c.kda.num_heads * c.kda.head_dim * c.kda.head_dim;
  s->per_layer_ = s->recurrent_ + 3 * (c.kda.conv_kernel - 1) * c.kda.projection();
  s->width_ = c.mla.cache_width();
  // Zeroed: the state of an empty sequence, and pages that hold no NaN for masked reads.
  absl::StatusOr<cuda::DeviceBuffer> kda =
      cuda::DeviceBuffer::Zeroed(slots * s->slot_floats() * static_cast<int64_t>(sizeof(float)));
  if (!kda.ok()) return kda.status();
  s->kda_ = std::move(*kda);
  absl::StatusOr<cuda::DeviceBuffer> kv = cuda::DeviceBuffer::Zeroed(
      s->mla_layers_ * pages * page_size * s->width_ * static_cast<int64_t>(sizeof(float)));
  if (!kv.ok()) return kv.status();
  s->kv_ = std::move(*kv);
  return s;
}

absl::Status DeviceState::CheckSlot(int64_t slot) const {
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("state op: slot ", slot, " outside [0, ", slots_, ")"));
  }
  return absl::OkStatus();
}

absl::Status DeviceState::CheckPages(const std::vector<int32_t>& pages) const {
  for (int32_t p : pages) {
    if (p < 0 || p >= pages_) {
      return absl::InvalidArgumentError(absl::StrCat("state op: page ", p, " outside [0, ", pages_, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceState::Apply(const StateOp& op, cudaStream_t stream) {
  const int64_t slot_bytes = slot_floats() * static_cast<int64_t>(sizeof(float));
  const int64_t page_floats = page_size_ * width_;
  auto account = [&](const std::vector<float>& v, int sign) {
    snapshot_bytes_ += sign * static_cast<int64_t>(v.size() * sizeof(float));
  };
  auto copy = [&](void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind) {
    return cuda::CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, stream),
                            "state op copy");
  };
  switch (op.kind) {
    case StateOpKind::kClearSlot: {
      if (kda_layers_ == 0) return absl::OkStatus();
      KIMI_RETURN_IF_ERROR(CheckSlot(op.slot));
      KIMI_RETURN_IF_ERROR(cuda::CudaStatus(
          cudaMemsetAsync(kda_.as<float>() + op.slot * slot_floats(), 0,
                          static_cast<size_t>(slot_bytes), stream),
          "state op clear"));
      break;
    }
    case StateOpKind::kSaveSlot: {
      if (kda_layers_ > 0) KIMI_RETURN_IF_ERROR(CheckSlot(op.slot));
      std::vector<float>& v = snapshots_[op.handle];
      account(v, -1);
      v.assign(kda_layers_ > 0 ? slot_floats() : 0, 0.0f);
      account(v, +1);
      if (kda_layers_ > 0) {
        KIMI_RETURN_IF_ERROR(copy(v.data(), kda_.as<float>() + op.slot * slot_floats(), slot_bytes,
                                  cudaMemcpyDeviceToHost));
      }
      break;
    }
    case StateOpKind::kLoadSlot: {
      auto it = snapshots_.find(op.handle);
      if (it == snapshots_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("state op: no snapshot ", op.handle));
      }
      if (kda_layers_ == 0) return absl::OkStatus();
      KIMI_RETURN_IF_ERROR(CheckSlot(op.slot));
      if (static_cast<int64_t>(it->second.size()) != slot_floats()) {
        return absl::InvalidArgumentError(absl::StrCat("state op: snapshot ", op.handle, " is not a slot"));
      }
      KIMI_RETURN_IF_ERROR(copy(kda_.as<float>() + op.slot * slot_floats(), it->second.data(),
                                slot_bytes, cudaMemcpyHostToDevice));
      break;
    }
    case StateOpKind::kSavePages: {
      KIMI_RETURN_IF_ERROR(CheckPages(op.pages));
      std::vector<float>& v = snapshots_[op.handle];
      account(v, -1);
      v.assign(mla_layers_ * static_cast<int64_t>(op.pages.size()) * page_floats, 0.0f);
      account(v, +1);
      float* out = v.data();
      for (int64_t l = 0; l < mla_layers_; ++l) {
        for (int32_t p : op.pages) {
          KIMI_RETURN_IF_ERROR(copy(out, Kv(l) + p * page_floats, page_floats * 4, cudaMemcpyDeviceToHost));
          out += page_floats;
        }
      }
      break;
    }
    case StateOpKind::kLoadPages: {
      auto it = snapshots_.find(op.handle);
      if (it == snapshots_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("state op: no page snapshot ", op.handle));
      }
      KIMI_RETURN_IF_ERROR(CheckPages(op.pages));
      if (static_cast<int64_t>(it->second.size()) !=
          mla_layers_ * static_cast<int64_t>(op.pages.size()) * page_floats) {
        return absl::InvalidArgumentError(
            absl::StrCat("state op: snapshot ", op.handle, " holds another number of pages"));
      }
      const float* in = it->second.data();
      for (int64_t l = 0; l < mla_layers_; ++l) {
        for (int32_t p : op.pages) {
          KIMI_RETURN_IF_ERROR(copy(Kv(l) + p * page_floats, in, page_floats * 4, cudaMemcpyHostToDevice));
          in += page_floats;
        }
      }
      break;
    }
    case StateOpKind::kDrop: {
      auto it = snapshots_.find(op.handle);
      if (it != snapshots_.end()) {
        account(it->second, -1);
        snapshots_.erase(it);
      }
      return absl::OkStatus();
    }
  }
  // Host snapshot memory is pageable: wait so the copies are complete when Apply returns.
  return cuda::CudaStatus(cudaStreamSynchronize(stream), "state op");
}

}  // namespace kimi::gpu
