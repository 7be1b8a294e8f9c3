// A rendered chat prompt before tokenisation, and the built-in Kimi Linear chat format.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace kimi::tokenizer {

// Prompt text in pieces. Special-token texts are recognised only inside trusted pieces (the
// format's or template's own text); untrusted pieces (message content, names, tool JSON) are always
// ordinary text, so a user cannot inject <|im_end|>. Tokenisation runs over the concatenated text,
// so ids equal those of encoding the whole rendered string whenever content holds no special text.
struct PromptSegment {
  std::string text;
  bool trusted = false;
};
using Prompt = std::vector<PromptSegment>;

// Appends text to a prompt, merging with the last piece when the trust matches.
void AppendSegment(Prompt* prompt, absl::string_view text, bool trusted);
std::string PromptText(const Prompt& prompt);

// Python's json.dumps(value, ensure_ascii=False) (separators ", " and ": "), which is what the
// `tojson` filter of HF chat templates produces. Keys keep their order.
std::string PythonJsonDumps(const nlohmann::ordered_json& value, absl::string_view item_sep = ", ",
                            absl::string_view key_sep = ": ");

// KIMI_LINEAR.md 4.1: [tool_declare turn], then per message <|im_user|> / <|im_assistant|> /
// <|im_system|> (every other role), name-or-role, <|im_middle|>, content (+ tool calls, or
// "## Return of {id}\n" before a tool result), <|im_end|>; no newlines between turns, no BOS,
// no injected system prompt; add_generation_prompt appends <|im_assistant|>assistant<|im_middle|>.
absl::StatusOr<Prompt> RenderKimiLinearChat(const std::vector<ChatMessage>& messages,
                                            const ChatOptions& options);

// The special tokens RenderKimiLinearChat uses.
const std::vector<std::string>& KimiLinearChatTokens();

}  // namespace kimi::tokenizer
