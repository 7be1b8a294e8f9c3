// Synthetic checkpoints in exactly the published layouts (config.json keys, tensor names, dtypes,
// MXFP4 packing, tiktoken.model, tokenizer_config.json), scaled down, with deterministic random
// weights. No real weights are reachable here; tests and benchmarks run on these.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kimi {

struct SyntheticOptions {
  std::string preset;   // one of SyntheticPresets()
  std::string out_dir;  // created if missing
  uint64_t seed = 0;
  // A tiktoken-format rank file to use as the base vocabulary (e.g. cl100k_base); empty: the 256
  // single bytes. Kimi's 256 special tokens follow the base ranks.
  std::string tiktoken_path;
  std::function<void(const std::string&)> progress;
};

std::vector<std::string> SyntheticPresets();

// config.json text of a preset for a base vocabulary of `base_vocab` ranks.
absl::StatusOr<std::string> PresetConfigJson(const std::string& preset, int64_t base_vocab);

absl::Status WriteSyntheticModel(const SyntheticOptions& options);

// E2M1 code nearest to v (ties to the even code), as the MXFP4 packer uses it.
uint8_t NearestE2m1(float v);

}  // namespace kimi
