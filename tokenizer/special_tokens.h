// Special tokens of a checkpoint: the ids after the base ranks, named by tokenizer_config.json's
// `added_tokens_decoder` (ids without an entry are `<|reserved_token_{id}|>`, as
// tokenization_kimi.py names them), and the end-of-turn ids the checkpoint names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kimi::tokenizer {

struct SpecialToken {
  std::string text;
  int32_t id = 0;
  bool special = true;  // tokenizer_config.json's flag; false for e.g. <|tool_call_begin|>
};

class SpecialTokens {
 public:
  // Kimi's reserved range has 256 ids: [num_base, num_base + 256).
  static constexpr int32_t kNumReserved = 256;

  // From tokenizer_config.json text: the reserved range plus any listed id beyond it.
  static absl::StatusOr<SpecialTokens> FromTokenizerConfig(absl::string_view json,
                                                           int32_t num_base);
  // From an explicit list (e.g. cl100k_base's <|endoftext|>); ids must be unique, texts non-empty.
  static absl::StatusOr<SpecialTokens> FromList(std::vector<SpecialToken> tokens);

  std::optional<int32_t> Id(absl::string_view text) const;
  const SpecialToken* Find(int32_t id) const;
  const std::vector<SpecialToken>& all() const { return tokens_; }
  // tokenizer_config.json's eos_token, when it names one.
  const std::optional<std::string>& eos_token() const { return eos_token_; }

  // The leftmost special-token text in text[from, end), longest first where several start at the
  // same byte. False when there is none.
  bool FindNext(absl::string_view text, size_t from, size_t* begin, size_t* end, int32_t* id) const;

 private:
  absl::Status Index();
  std::vector<SpecialToken> tokens_;
  absl::flat_hash_map<std::string, int32_t> id_of_;
  absl::flat_hash_map<int32_t, size_t> index_of_id_;
  std::vector<size_t> lengths_;  // distinct text lengths, longest first
  bool first_byte_[256] = {};
  std::optional<std::string> eos_token_;
};

}  // namespace kimi::tokenizer
