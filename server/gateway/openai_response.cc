#include "server/gateway/openai_response.h"

#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace kimi::gateway {
namespace {

using json = nlohmann::json;

bool IsChat(const ResponseMeta& meta) { return meta.endpoint == Endpoint::kChat; }

json Envelope(const ResponseMeta& meta, bool chunk) {
  const char* object =
      IsChat(meta) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

json Chunk(const ResponseMeta& meta, json choice) {
  json j = Envelope(meta, /*chunk=*/true);
  j["choices"] = json::array({std::move(choice)});
  if (meta.include_usage) j["usage"] = nullptr;
  return j;
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}

// A token as logprobs name it: its bytes where they are UTF-8; else, as OpenAI writes a token that
// splits a character, "bytes:" and each byte as \xHH (so that two such tokens stay distinct).
std::string TokenString(const std::string& bytes) {
  if (tokenizer::IsValidUtf8(bytes)) return bytes;
  std::string s = "bytes:";
  for (unsigned char c : bytes) absl::StrAppend(&s, "\\x", absl::Hex(c, absl::kZeroPad2));
  return s;
}

json ChatLogprobs(const ResponseMeta& meta, const std::vector<v1::TokenLogprob>& tokens,
                  const TokenPieceFn& piece_of) {
  json content = json::array();
  for (const v1::TokenLogprob& t : tokens) {
    const std::string b = piece_of(t.token_id()).bytes;
    json top = json::array();
    for (int k = 0; k < t.top_size() && k < meta.top_logprobs; ++k) {
      const std::string tb = piece_of(t.top(k).token_id()).bytes;
      top.push_back(
          {{"token", TokenString(tb)}, {"logprob", t.top(k).logprob()}, {"bytes", Bytes(tb)}});
    }
    content.push_back({{"token", TokenString(b)},
                       {"logprob", t.logprob()},
                       {"bytes", Bytes(b)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json CompletionLogprobs(const ResponseMeta& meta, const std::vector<v1::TokenLogprob>& tokens,
                        const TokenPieceFn& piece_of, TextOffsets* offsets) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const v1::TokenLogprob& t : tokens) {
    const TokenPiece piece = piece_of(t.token_id());
    const std::string name = TokenString(piece.bytes);
    // The alternatives and, as OpenAI's "up to logprobs + 1", the chosen token.
    json top = json::object();
    for (int k = 0; k < t.top_size() && k < meta.top_logprobs; ++k) {
      top[TokenString(piece_of(t.top(k).token_id()).bytes)] = t.top(k).logprob();
    }
    top[name] = t.logprob();
    out["tokens"].push_back(name);
    out["token_logprobs"].push_back(t.logprob());
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offsets->Add(piece));
  }
  return out;
}

json ChoiceJson(const ResponseMeta& meta, int index, const ChoiceResult& c,
                const TokenPieceFn& piece_of) {
  TextOffsets offsets;
  json choice = {{"index", index},
                 {"logprobs", LogprobsJson(meta, c.logprobs, piece_of, &offsets)},
                 {"finish_reason", FinishReasonJson(c.finish)}};
  if (IsChat(meta)) {
    choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = c.text;
  }
  return choice;
}

}  // namespace

int64_t TextOffsets::Add(const TokenPiece& token) {
  const int64_t at = chars_;  // a character in progress starts here too
  if (!token.in_text) return at;
  partial_ += token.bytes;
  size_t i = 0, len = 0;
  while (i < partial_.size() &&
         tokenizer::ScanUtf8(partial_, i, &len) != tokenizer::Utf8Status::kIncomplete) {
    ++chars_;  // a whole character, or U+FFFD for an invalid part
    i += len;
  }
  partial_.erase(0, i);
  return at;
}

void ChoiceResult::Add(const v1::GenerateResponse& m, bool keep_text) {
  tokens_seen += static_cast<uint32_t>(m.token_ids_size());
  if (keep_text) {
    text += m.text();
    logprobs.insert(logprobs.end(), m.logprobs().begin(), m.logprobs().end());
  }
  if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    finish = m.finish_reason();
    usage = m.usage();
  }
}

json FinishReasonJson(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    default:
      break;
  }
  return nullptr;
}

json UsageJson(uint32_t prompt_tokens, uint32_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", static_cast<uint64_t>(prompt_tokens) + completion_tokens}};
}

json TotalUsage(const std::vector<ChoiceResult>& choices, int n) {
  uint32_t prompt = 0, completion = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i % static_cast<size_t>(n) == 0) prompt += choices[i].usage.prompt_tokens();
    completion += choices[i].usage.completion_tokens();
  }
  return UsageJson(prompt, completion);
}

json LogprobsJson(const ResponseMeta& meta, const std::vector<v1::TokenLogprob>& tokens,
                  const TokenPieceFn& piece_of, TextOffsets* offsets) {
  if (meta.top_logprobs < 0) return nullptr;
  return IsChat(meta) ? ChatLogprobs(meta, tokens, piece_of)
                      : CompletionLogprobs(meta, tokens, piece_of, offsets);
}

json CompletionJson(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices, int n,
                    const TokenPieceFn& piece_of) {
  json j = Envelope(meta, /*chunk=*/false);
  j["choices"] = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    j["choices"].push_back(ChoiceJson(meta, static_cast<int>(i), choices[i], piece_of));
  }
  j["usage"] = TotalUsage(choices, n);
  return j;
}

json RoleChunk(const ResponseMeta& meta, int index) {
  return Chunk(meta, {{"index", index},
                      {"delta", {{"role", "assistant"}, {"content", ""}}},
                      {"logprobs", nullptr},
                      {"finish_reason", nullptr}});
}

std::optional<json> DeltaChunk(const ResponseMeta& meta, int index, const v1::GenerateResponse& m,
                               const TokenPieceFn& piece_of, TextOffsets* offsets) {
  const bool with_logprobs = meta.top_logprobs >= 0 && m.logprobs_size() > 0;
  if (m.text().empty() && !with_logprobs) return std::nullopt;
  const std::vector<v1::TokenLogprob> tokens(m.logprobs().begin(), m.logprobs().end());
  json choice = {
      {"index", index},
      {"logprobs", with_logprobs ? LogprobsJson(meta, tokens, piece_of, offsets) : json(nullptr)},
      {"finish_reason", nullptr}};
  if (IsChat(meta)) {
    choice["delta"] = {{"content", m.text()}};
  } else {
    choice["text"] = m.text();
  }
  return Chunk(meta, std::move(choice));
}

json FinishChunk(const ResponseMeta& meta, int index, v1::FinishReason reason) {
  json choice = {
      {"index", index}, {"logprobs", nullptr}, {"finish_reason", FinishReasonJson(reason)}};
  if (IsChat(meta)) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  return Chunk(meta, std::move(choice));
}

json UsageChunk(const ResponseMeta& meta, const json& usage) {
  json j = Envelope(meta, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = usage;
  return j;
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

std::string SseData(const json& value) { return "data: " + Dump(value) + "\n\n"; }

}  // namespace kimi::gateway
