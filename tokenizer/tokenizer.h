// kimi::tokenizer: text <-> token ids for Kimi checkpoints.
//
// A checkpoint directory holds `tiktoken.model` (base64 token + rank per line),
// `tokenizer_config.json` (special tokens after the base ranks), `config.json` (eos_token_id) and,
// optionally, `chat_template.jinja` (used for chat when present; else the built-in Kimi Linear
// format). Encoding is tiktoken's: PCRE2 pre-tokenisation with Kimi's pattern, then byte-level BPE;
// ids are identical to tiktoken's for the same ranks and pattern. A Tokenizer is immutable after
// Load and every method is thread-safe. Errors are values; no method throws or aborts on any input.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/special_tokens.h"

namespace kimi::tokenizer {

struct ToolCall {
  std::string id;         // e.g. "functions.get_weather:0"; empty: derived from name and index
  std::string name;       // function name
  std::string arguments;  // JSON text, inserted as given
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool | any other (rendered like system)
  std::string content;
  std::string name;                  // optional; replaces the role name in the header
  std::vector<ToolCall> tool_calls;  // assistant messages
  std::string tool_call_id;          // tool messages: the call this result answers
};

struct ChatOptions {
  bool add_generation_prompt = true;
  std::string tools_json;  // JSON array of tool declarations; empty = no tools
};

class BpeRanks;
class Pretokenizer;
class ChatTemplate;

class Tokenizer {
 public:
  // Reads a checkpoint directory (see the file comment).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);

  // Builds a tokenizer from parts: tiktoken-format ranks text, a tiktoken (Rust regex) pattern
  // and special tokens. No Kimi length chunking, no chat template: this is plain tiktoken.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromParts(absl::string_view ranks_text,
                                                              absl::string_view pattern,
                                                              std::vector<SpecialToken> specials);
  // As FromParts, with a pattern already in PCRE2 syntax (used as is, no translation).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromPartsPcre2(
      absl::string_view ranks_text, absl::string_view pcre2_pattern,
      std::vector<SpecialToken> specials);
  ~Tokenizer();

  // allow_special: special-token texts in `text` become their ids (tokenization_kimi.py encodes
  // with allowed_special="all"); otherwise they are ordinary text. Invalid UTF-8 is kept as bytes.
  std::vector<int32_t> Encode(absl::string_view text, bool allow_special) const;
  // Raw bytes of the tokens (not necessarily valid UTF-8); unknown ids decode to nothing.
  std::string Decode(std::span<const int32_t> ids) const;

  // Chat prompt to ids: the checkpoint's chat_template.jinja when it has one, else the Kimi Linear
  // format (KIMI_LINEAR.md 4.1). Special tokens come only from the format or template itself:
  // special-token text inside message content stays ordinary text.
  absl::StatusOr<std::vector<int32_t>> RenderChat(const std::vector<ChatMessage>& messages,
                                                  const ChatOptions& options = {}) const;
  // The same prompt as text (special tokens as their text).
  absl::StatusOr<std::string> RenderChatText(const std::vector<ChatMessage>& messages,
                                             const ChatOptions& options = {}) const;
  bool has_chat_template() const { return chat_template_ != nullptr; }

  // Every end-of-turn id the checkpoint names: tokenizer_config eos_token, config.json and
  // generation_config.json eos_token_id, and [EOS], [EOT], <|im_end|>, <|end_of_msg|> when present.
  const std::vector<int32_t>& stop_token_ids() const { return stop_token_ids_; }
  // One past the largest id (base ranks, then special tokens).
  int32_t vocab_size() const { return vocab_size_; }
  int32_t num_base_tokens() const;
  std::optional<int32_t> TokenId(absl::string_view special_text) const;
  // A token's bytes (base) or text (special); empty for unknown ids.
  std::string TokenText(int32_t id) const;
  // True for the added tokens tokenizer_config.json marks special (and unnamed reserved ids); false
  // for base ranks and for added tokens marked `"special": false`, such as Kimi's tool-call markers
  // (<|tool_call_begin|>, K3's <|open|>), which generated text keeps so clients can parse it.
  bool IsSpecial(int32_t id) const;
  const SpecialTokens& special_tokens() const { return specials_; }

 private:
  friend class ChatRenderer;
  Tokenizer();
  void EncodeOrdinary(absl::string_view text, std::vector<int32_t>* out) const;
  void EncodeChunk(absl::string_view text, std::vector<int32_t>* out) const;

  std::unique_ptr<BpeRanks> ranks_;
  std::unique_ptr<Pretokenizer> pretokenizer_;
  SpecialTokens specials_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::vector<int32_t> stop_token_ids_;
  int32_t vocab_size_ = 0;
  bool kimi_chunking_ = false;
};

}  // namespace kimi::tokenizer
