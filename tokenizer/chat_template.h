// A checkpoint's chat_template.jinja, rendered with the Jinja subset of jinja.h. Variables, as HF
// transformers passes them: messages (role, content, name, tool_calls [{id, type, function: {name,
// arguments}}], tool_call_id; absent fields are undefined), tools (parsed JSON, when given),
// add_generation_prompt, bos_token, eos_token.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace kimi::tokenizer {

namespace jinja {
class Template;
}

struct TemplateTokens {
  std::string bos_token;
  std::string eos_token;
};

class ChatTemplate {
 public:
  // Fails on syntax errors and on constructs outside the subset, naming the line.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(absl::string_view source);
  ~ChatTemplate();

  absl::StatusOr<Prompt> Render(const std::vector<ChatMessage>& messages,
                                const ChatOptions& options, const TemplateTokens& tokens) const;

 private:
  ChatTemplate();
  std::unique_ptr<jinja::Template> template_;
};

}  // namespace kimi::tokenizer
