// The exact tensor set a config implies, by the checkpoint's own names. One list serves the loader
// (what must be present, with which shape), kimi-plan (counts and bytes) and kimi-mkmodel (what to
// write), so the three cannot drift apart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/model_config.h"

namespace kimi {

enum class TensorRole {
  kFloat,        // bf16, fp16 or fp32
  kMxfp4Packed,  // U8 [rows, cols/2], two E2M1 codes per byte
  kMxfp4Scale,   // U8 [rows, cols/32], E8M0
};

// What a tensor is for, so accounting can group it (plan, sharding).
enum class TensorGroup {
  kEmbedding,
  kLmHead,
  kNorm,  // every 1-D norm / bias / small vector
  kKda,
  kMla,
  kDenseMlp,
  kRouter,
  kRoutedExpert,
  kSharedExpert,
  kLatentProj,
  kAttnRes,
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::optional<std::vector<int64_t>> alt_shape;  // another published layout of the same data
  TensorRole role = TensorRole::kFloat;
  TensorGroup group = TensorGroup::kNorm;
  int64_t layer = -1;   // -1: not in a layer
  int64_t expert = -1;  // routed expert index, -1 otherwise
  // Model parameters this tensor holds (a packed MXFP4 matrix counts its logical elements, its
  // scales count none).
  int64_t parameters = 0;
};

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Prefixes of tensors that belong to parts out of scope (K3 vision tower) or are derived buffers
// some exporters save (rotary inv_freq); the loader skips them with a note.
bool IsSkippedTensor(const ModelConfig& config, const std::string& name);

}  // namespace kimi
