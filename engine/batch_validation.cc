// ValidateBatch (engine/engine.h): shared by the CPU engine and the CUDA step runner so both
// reject the same batches with the same messages.
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"

namespace kimi {

absl::Status ValidateBatch(const ModelConfig& c, std::span<const SequenceStep> batch,
                           int64_t num_slots, int64_t num_pages, int64_t page_size) {
  const bool has_kda = c.StageLayersOf(LayerKind::kKda) > 0;
  const bool has_mla = c.StageLayersOf(LayerKind::kMla) > 0;
  std::vector<char> slot_used(has_kda ? num_slots : 0, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceStep& s = batch[i];
    const auto where = [&] { return absl::StrCat("Step: sequence ", i, ": "); };
    if (s.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(where(), "no tokens"));
    if (s.pos0 < 0) return absl::InvalidArgumentError(absl::StrCat(where(), "pos0 < 0"));
    const int64_t end = s.pos0 + static_cast<int64_t>(s.tokens.size());
    // Positions reach int32 kernels (RoPE tables, the CUDA position buffers).
    if (end > INT32_MAX)
      return absl::InvalidArgumentError(absl::StrCat(where(), "position beyond 2^31"));
    for (int32_t id : s.tokens) {
      if (id < 0 || id >= c.vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "token id ", id, " outside [0, ", c.vocab, ")"));
      }
    }
    if (has_kda) {
      if (s.kda_slot < 0 || s.kda_slot >= num_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "KDA slot ", s.kda_slot, " outside the pool"));
      }
      if (slot_used[s.kda_slot]++) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "KDA slot ", s.kda_slot, " used twice in one step"));
      }
    }
    if (has_mla) {
      const int64_t needed = (end + page_size - 1) / page_size;
      if (static_cast<int64_t>(s.pages.size()) < needed) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "page table has ", s.pages.size(),
                                                       " pages, positions up to ", end, " need ",
                                                       needed));
      }
      for (int64_t p = 0; p < needed; ++p) {
        if (s.pages[p] < 0 || s.pages[p] >= num_pages) {
          return absl::InvalidArgumentError(
              absl::StrCat(where(), "page ", s.pages[p], " outside the cache"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kimi
