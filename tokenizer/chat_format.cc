#include "tokenizer/chat_format.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kimi::tokenizer {

void AppendSegment(Prompt* prompt, absl::string_view text, bool trusted) {
  if (text.empty()) return;
  if (!prompt->empty() && prompt->back().trusted == trusted) {
    prompt->back().text.append(text.data(), text.size());
  } else {
    prompt->push_back({std::string(text), trusted});
  }
}

std::string PromptText(const Prompt& prompt) {
  std::string out;
  for (const PromptSegment& s : prompt) out += s.text;
  return out;
}

namespace {

void DumpString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);  // ensure_ascii=False: UTF-8 passes through
        }
    }
  }
  out->push_back('"');
}

void Dump(const nlohmann::ordered_json& v, absl::string_view item_sep, absl::string_view key_sep,
          std::string* out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out->append(item_sep.data(), item_sep.size());
        first = false;
        DumpString(key, out);
        out->append(key_sep.data(), key_sep.size());
        Dump(item, item_sep, key_sep, out);
      }
      out->push_back('}');
      break;
    }
    case nlohmann::ordered_json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out->append(item_sep.data(), item_sep.size());
        first = false;
        Dump(item, item_sep, key_sep, out);
      }
      out->push_back(']');
      break;
    }
    case nlohmann::ordered_json::value_t::string:
      DumpString(v.get<std::string>(), out);
      break;
    case nlohmann::ordered_json::value_t::boolean:
      *out += v.get<bool>() ? "true" : "false";
      break;
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      *out += "null";
      break;
    default:  // numbers: shortest round-trip form, as Python's repr
      *out += v.dump();
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::ordered_json& value, absl::string_view item_sep,
                            absl::string_view key_sep) {
  std::string out;
  Dump(value, item_sep, key_sep, &out);
  return out;
}

const std::vector<std::string>& KimiLinearChatTokens() {
  static const auto* tokens = new std::vector<std::string>{
      "<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"};
  return *tokens;
}

absl::StatusOr<Prompt> RenderKimiLinearChat(const std::vector<ChatMessage>& messages,
                                            const ChatOptions& options) {
  Prompt p;
  if (!options.tools_json.empty()) {
    const auto tools = nlohmann::ordered_json::parse(options.tools_json, nullptr,
                                                     /*allow_exceptions=*/false);
    if (tools.is_discarded()) return absl::InvalidArgumentError("tools_json is not valid JSON");
    AppendSegment(&p, "<|im_system|>tool_declare<|im_middle|>", true);
    AppendSegment(&p, PythonJsonDumps(tools), false);
    AppendSegment(&p, "<|im_end|>", true);
  }
  int tool_call_index = 0;
  for (const ChatMessage& m : messages) {
    const char* open = m.role == "user"        ? "<|im_user|>"
                       : m.role == "assistant" ? "<|im_assistant|>"
                                               : "<|im_system|>";
    AppendSegment(&p, open, true);
    AppendSegment(&p, m.name.empty() ? m.role : m.name, false);
    AppendSegment(&p, "<|im_middle|>", true);
    if (m.role == "tool") {
      AppendSegment(&p, "## Return of ", true);
      AppendSegment(&p, m.tool_call_id, false);
      AppendSegment(&p, "\n", true);
    }
    AppendSegment(&p, m.content, false);
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      AppendSegment(&p, "<|tool_calls_section_begin|>", true);
      for (const ToolCall& c : m.tool_calls) {
        AppendSegment(&p, "<|tool_call_begin|>", true);
        AppendSegment(
            &p, c.id.empty() ? absl::StrCat("functions.", c.name, ":", tool_call_index) : c.id,
            false);
        AppendSegment(&p, "<|tool_call_argument_begin|>", true);
        AppendSegment(&p, c.arguments, false);
        AppendSegment(&p, "<|tool_call_end|>", true);
        ++tool_call_index;
      }
      AppendSegment(&p, "<|tool_calls_section_end|>", true);
    }
    AppendSegment(&p, "<|im_end|>", true);
  }
  if (options.add_generation_prompt) {
    AppendSegment(&p, "<|im_assistant|>", true);
    AppendSegment(&p, "assistant", false);
    AppendSegment(&p, "<|im_middle|>", true);
  }
  return p;
}

}  // namespace kimi::tokenizer
