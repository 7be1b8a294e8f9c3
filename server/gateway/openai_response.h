// kimi.v1 stream messages -> OpenAI response objects and SSE chunks. Pure functions: the token
// bytes of logprobs come from a callback (the backend's Detokenize, cached by the caller).
//
// Non-streaming: chat.completion / text_completion with every choice and `usage`.
// Streaming (server-sent events, one `data: {json}\n\n` each, `data: [DONE]\n\n` last):
//   chat: a role chunk per choice, content chunks, a finish chunk per choice (empty delta);
//   completions: text chunks, a finish chunk per choice;
//   with stream_options.include_usage every chunk has "usage": null and a last chunk with empty
//   `choices` carries the usage.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kimi/v1/generation.pb.h"
#include "nlohmann/json.hpp"
#include "server/gateway/openai_request.h"

namespace kimi::gateway {

struct ResponseMeta {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // Unix seconds
  std::string model;
  int top_logprobs = -1;  // alternatives per token to show; -1: no logprobs
  bool include_usage = false;
};

// One token id as logprobs show it: its bytes as the vocabulary holds them (special tokens as their
// text; not always UTF-8, since a token can hold part of a character), and whether generated text
// shows it (special tokens are left out).
struct TokenPiece {
  std::string bytes;
  bool in_text = true;
};
using TokenPieceFn = std::function<TokenPiece(uint32_t token_id)>;

// Completions' text_offset: where each token starts in its choice's text, in characters. The bytes
// of the tokens the text shows are decoded as the server decodes them (whole characters, U+FFFD for
// each maximal invalid part), so a token is at the character its first byte falls in; a token the
// text leaves out is where the next character will be.
class TextOffsets {
 public:
  int64_t Add(const TokenPiece& token);  // returns the token's offset

 private:
  int64_t chars_ = 0;
  std::string partial_;  // the start of a character not yet complete
};

// Everything one choice produced (non-streaming), or just its end (streaming).
struct ChoiceResult {
  std::string text;
  std::vector<v1::TokenLogprob> logprobs;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;           // from the last message (none for a stream cut short)
  uint32_t tokens_seen = 0;  // token ids received, whether or not the stream finished
  void Add(const v1::GenerateResponse& m, bool keep_text);
};

// "stop", "length"; null while streaming and for CANCELLED / ERROR (those end in an error instead).
nlohmann::json FinishReasonJson(v1::FinishReason reason);

nlohmann::json UsageJson(uint32_t prompt_tokens, uint32_t completion_tokens);

// Usage over all choices: prompt tokens once per prompt (choice % n == 0), completion tokens
// summed.
nlohmann::json TotalUsage(const std::vector<ChoiceResult>& choices, int n);

// The `logprobs` value of one choice (or chunk) over these tokens; null when none were asked for.
// Completions' text offsets continue from *offsets.
nlohmann::json LogprobsJson(const ResponseMeta& meta, const std::vector<v1::TokenLogprob>& tokens,
                            const TokenPieceFn& piece_of, TextOffsets* offsets);

nlohmann::json CompletionJson(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                              int n, const TokenPieceFn& piece_of);

// Streaming chunks.
nlohmann::json RoleChunk(const ResponseMeta& meta, int index);
// New text (and logprobs) of one message; nullopt when there is nothing to send.
std::optional<nlohmann::json> DeltaChunk(const ResponseMeta& meta, int index,
                                         const v1::GenerateResponse& m,
                                         const TokenPieceFn& piece_of, TextOffsets* offsets);
nlohmann::json FinishChunk(const ResponseMeta& meta, int index, v1::FinishReason reason);
nlohmann::json UsageChunk(const ResponseMeta& meta, const nlohmann::json& usage);

// One server-sent event carrying `value` (invalid UTF-8 replaced, never thrown).
std::string SseData(const nlohmann::json& value);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// JSON text for a response body (invalid UTF-8 replaced, never thrown).
std::string Dump(const nlohmann::json& value);

}  // namespace kimi::gateway
