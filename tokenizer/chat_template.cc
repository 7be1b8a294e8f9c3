#include "tokenizer/chat_template.h"

#include <map>

#include "tokenizer/jinja.h"

namespace kimi::tokenizer {
namespace {

using jinja::Value;
using jinja::ValueDict;
using jinja::ValueList;

// Request data is tainted: its text can never turn into special tokens.
Value MessageValue(const ChatMessage& m) {
  ValueDict d;
  d.Set("role", Value::Str(m.role, /*tainted=*/true));
  d.Set("content", Value::Str(m.content, /*tainted=*/true));
  if (!m.name.empty()) d.Set("name", Value::Str(m.name, true));
  if (!m.tool_call_id.empty()) d.Set("tool_call_id", Value::Str(m.tool_call_id, true));
  if (!m.tool_calls.empty()) {
    ValueList calls;
    for (const ToolCall& c : m.tool_calls) {
      ValueDict fn;
      fn.Set("name", Value::Str(c.name, true));
      fn.Set("arguments", Value::Str(c.arguments, true));
      ValueDict call;
      if (!c.id.empty()) call.Set("id", Value::Str(c.id, true));
      call.Set("type", Value::Str("function", true));
      call.Set("function", Value::Dict(std::move(fn)));
      calls.push_back(Value::Dict(std::move(call)));
    }
    d.Set("tool_calls", Value::List(std::move(calls)));
  }
  return Value::Dict(std::move(d));
}

}  // namespace

ChatTemplate::ChatTemplate() = default;
ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(absl::string_view source) {
  auto t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status();
  auto ct = std::unique_ptr<ChatTemplate>(new ChatTemplate());
  ct->template_ = *std::move(t);
  return ct;
}

absl::StatusOr<Prompt> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                            const ChatOptions& options,
                                            const TemplateTokens& tokens) const {
  std::map<std::string, Value> globals;
  ValueList list;
  for (const ChatMessage& m : messages) list.push_back(MessageValue(m));
  globals["messages"] = Value::List(std::move(list));
  globals["add_generation_prompt"] = Value::Bool(options.add_generation_prompt);
  globals["bos_token"] = Value::Str(tokens.bos_token);
  globals["eos_token"] = Value::Str(tokens.eos_token);
  if (!options.tools_json.empty()) {
    const auto tools = nlohmann::ordered_json::parse(options.tools_json, nullptr,
                                                     /*allow_exceptions=*/false);
    if (tools.is_discarded()) return absl::InvalidArgumentError("tools_json is not valid JSON");
    globals["tools"] = jinja::FromJson(tools, /*tainted=*/true);
  }
  return template_->Render(globals);
}

}  // namespace kimi::tokenizer
