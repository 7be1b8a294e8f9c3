// Byte-level BPE over tiktoken ranks. A token's rank is both its id and its merge priority: the
// pair whose concatenation has the lowest rank merges first, ties go to the leftmost pair, exactly
// as tiktoken's `_byte_pair_merge`. Every one of the 256 single bytes must have a rank, so any
// byte string can be encoded (the byte-level fallback) and decoded back unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kimi::tokenizer {

class BpeRanks {
 public:
  // Parses tiktoken text (`tiktoken.model`, `*.tiktoken`): one "<base64 of the bytes> <rank>" per
  // line, blank lines ignored. Ranks may have gaps but no duplicates (of bytes or of ranks).
  static absl::StatusOr<BpeRanks> Parse(absl::string_view text);

  // Appends the ids of one pre-tokenised piece. Never fails: unmergeable bytes become byte tokens.
  void EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const;

  // The two merge loops behind EncodePiece, public for tests that prove they agree:
  // tiktoken's O(n^2) loop (fast on short pieces) and a heap loop (O(n log n), for long ones).
  void MergeQuadratic(absl::string_view piece, std::vector<int32_t>* out) const;
  void MergeHeap(absl::string_view piece, std::vector<int32_t>* out) const;

  std::optional<int32_t> Rank(absl::string_view bytes) const;
  // One past the largest rank.
  int32_t end_rank() const { return static_cast<int32_t>(bytes_of_.size()); }
  int32_t num_ranks() const { return static_cast<int32_t>(rank_of_.size()); }
  // The bytes of a rank; empty for a gap or an id out of range.
  absl::string_view Bytes(int32_t rank) const;

 private:
  absl::flat_hash_map<std::string, int32_t> rank_of_;
  std::vector<std::string> bytes_of_;  // [end_rank]; empty where the ranks have a gap
  int32_t byte_rank_[256] = {};
};

}  // namespace kimi::tokenizer
