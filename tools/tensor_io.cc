#include "tools/tensor_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"

namespace kimi::tools {

absl::StatusOr<TensorMap> ReadTensors(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  TensorMap out;
  for (const TensorInfo& t : (*file)->tensors()) {
    HostTensor h;
    h.shape = t.shape;
    h.dtype = t.dtype;
    const int64_t n = t.numel();
    if (t.dtype == DType::kU8) {
      h.u8.assign(t.data, t.data + n);
      h.f32.resize(n);
      for (int64_t i = 0; i < n; ++i) h.f32[i] = t.data[i];
    } else {
      h.f32.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        switch (t.dtype) {
          case DType::kF32: {
            float f;
            std::memcpy(&f, t.data + 4 * i, 4);
            h.f32[i] = f;
            break;
          }
          case DType::kF64: {
            double f;
            std::memcpy(&f, t.data + 8 * i, 8);
            h.f32[i] = static_cast<float>(f);
            break;
          }
          case DType::kBF16:
          case DType::kF16: {
            uint16_t b;
            std::memcpy(&b, t.data + 2 * i, 2);
            h.f32[i] = t.dtype == DType::kBF16 ? Bf16ToF32(b) : F16ToF32(b);
            break;
          }
          case DType::kI32: {
            int32_t v;
            std::memcpy(&v, t.data + 4 * i, 4);
            h.f32[i] = static_cast<float>(v);
            break;
          }
          case DType::kI64: {
            int64_t v;
            std::memcpy(&v, t.data + 8 * i, 8);
            h.f32[i] = static_cast<float>(v);
            break;
          }
          case DType::kU8:
            break;
        }
      }
    }
    out.emplace(t.name, std::move(h));
  }
  return out;
}

absl::Status WriteTensors(const std::string& path, const TensorMap& tensors) {
  std::vector<TensorToWrite> list;
  for (const auto& [name, t] : tensors) {
    TensorToWrite w;
    w.name = name;
    w.shape = t.shape;
    if (!t.i32.empty()) {
      w.dtype = DType::kI32;
      w.bytes = {reinterpret_cast<const uint8_t*>(t.i32.data()), t.i32.size() * 4};
    } else {
      w.dtype = DType::kF32;
      w.bytes = {reinterpret_cast<const uint8_t*>(t.f32.data()), t.f32.size() * 4};
    }
    list.push_back(w);
  }
  return WriteSafetensors(path, list);
}

absl::StatusOr<const HostTensor*> Need(const TensorMap& in, const std::string& name, size_t rank) {
  auto it = in.find(name);
  if (it == in.end()) return absl::InvalidArgumentError(absl::StrCat("missing input ", name));
  if (it->second.shape.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat("input ", name, " has rank ",
                                                   it->second.shape.size(), ", expected ", rank));
  }
  return &it->second;
}

float ScalarOr(const TensorMap& in, const std::string& name, float fallback) {
  auto it = in.find(name);
  if (it == in.end() || it->second.f32.empty()) return fallback;
  return it->second.f32[0];
}

}  // namespace kimi::tools
