#include "server/gateway/openai_request.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kimi::gateway {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr int64_t kMaxI32 = std::numeric_limits<int32_t>::max();

// Parameters each endpoint translates.
bool IsKnown(Endpoint e, const std::string& key) {
  static const std::set<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "presence_penalty",
      "frequency_penalty", "logprobs", "stream", "stream_options", "user",
      // Extensions, named as vLLM names them.
      "top_k", "min_p", "repetition_penalty", "ignore_eos"};
  static const std::set<std::string> chat = {"messages", "max_completion_tokens", "top_logprobs"};
  static const std::set<std::string> completions = {"prompt", "best_of"};
  return common.count(key) || (e == Endpoint::kChat ? chat : completions).count(key);
}

// OpenAI parameters the gateway cannot honour, accepted only at a value that asks for nothing.
bool IsHarmlessDefault(const std::string& key, const json& v) {
  if (v.is_null()) return true;
  if (key == "response_format") {
    return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text";
  }
  if (key == "logit_bias" || key == "metadata") return v.is_object() && v.empty();
  if (key == "tools" || key == "functions") return v.is_array() && v.empty();
  if (key == "tool_choice") return v == "none";
  if (key == "store" || key == "echo") return v == false;
  if (key == "service_tier") return v == "auto" || v == "default";
  if (key == "suffix") return v == "";
  // Without tools (refused unless empty) these ask for nothing.
  if (key == "parallel_tool_calls") return v.is_boolean();
  if (key == "modalities") return v == json::array({"text"});
  return false;
}

bool IsOpenAIParameter(const std::string& key) {
  static const std::set<std::string> known = {"tools",
                                              "tool_choice",
                                              "functions",
                                              "function_call",
                                              "parallel_tool_calls",
                                              "response_format",
                                              "logit_bias",
                                              "modalities",
                                              "audio",
                                              "prediction",
                                              "reasoning_effort",
                                              "service_tier",
                                              "store",
                                              "metadata",
                                              "web_search_options",
                                              "verbosity",
                                              "prompt_cache_key",
                                              "safety_identifier",
                                              "echo",
                                              "suffix"};
  return known.count(key) > 0;
}

absl::Status CheckKeys(Endpoint e, const json& body) {
  for (const auto& [key, value] : body.items()) {
    if (IsKnown(e, key) || IsHarmlessDefault(key, value)) continue;
    if (IsOpenAIParameter(key)) return UnsupportedParam(key);
    return InvalidParam(key, absl::StrCat("Unrecognized request argument supplied: ", key),
                        "unsupported_parameter");
  }
  return absl::OkStatus();
}

// A parameter's value; absent and null are the same (OpenAI treats null as unset).
const json* Find(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// "name: must be ..., got value" for an integer outside [lo, hi]. A `hi` of the wire's integer
// type (kMaxU32, kMaxI32) is no limit of the server's, which checks its own (max_tokens against
// limits.max_tokens, top_logprobs against 20): below `lo` the message states `lo` alone, so that
// the gateway and the server never give one field two different ranges.
absl::Status OutOfRange(const std::string& name, int64_t lo, int64_t hi, bool below,
                        const std::string& value) {
  std::string rule = absl::StrCat("in [", lo, ", ", hi, "]");
  if (hi == kMaxU32 || hi == kMaxI32) {
    rule = below ? absl::StrCat(">= ", lo) : absl::StrCat("at most ", hi, " (the API's integer)");
  }
  return InvalidParam(name, absl::StrCat(name, ": must be ", rule, ", got ", value));
}

// An integer parameter in [lo, hi]; integral floats (16.0) count as integers.
absl::Status ToInt(const json& v, const std::string& name, int64_t lo, int64_t hi, int64_t* out) {
  const bool integral_float = v.is_number_float() && std::isfinite(v.get<double>()) &&
                              std::floor(v.get<double>()) == v.get<double>() &&
                              std::fabs(v.get<double>()) < 9e15;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return OutOfRange(name, lo, hi, /*below=*/false, absl::StrCat(v.get<uint64_t>()));
  } else if (v.is_number_integer()) {
    *out = v.get<int64_t>();
  } else if (integral_float) {
    *out = static_cast<int64_t>(v.get<double>());
  } else {
    return InvalidType(name, "an integer");
  }
  if (*out < lo || *out > hi) return OutOfRange(name, lo, hi, *out < lo, absl::StrCat(*out));
  return absl::OkStatus();
}

absl::Status GetInt(const json& body, const char* key, int64_t lo, int64_t hi,
                    std::optional<int64_t>* out) {
  const json* v = Find(body, key);
  if (!v) return absl::OkStatus();
  int64_t x = 0;
  if (absl::Status s = ToInt(*v, key, lo, hi, &x); !s.ok()) return s;
  *out = x;
  return absl::OkStatus();
}

absl::Status GetFloat(const json& body, const char* key, std::optional<float>* out) {
  const json* v = Find(body, key);
  if (!v) return absl::OkStatus();
  if (!v->is_number()) return InvalidType(key, "a number");
  *out = static_cast<float>(v->get<double>());
  return absl::OkStatus();
}

absl::Status GetBool(const json& body, const char* key, bool* out) {
  const json* v = Find(body, key);
  if (!v) return absl::OkStatus();
  if (!v->is_boolean()) return InvalidType(key, "a boolean");
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const json& body, const char* key, std::string* out) {
  const json* v = Find(body, key);
  if (!v) return absl::OkStatus();
  if (!v->is_string()) return InvalidType(key, "a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status GetSeed(const json& body, v1::SamplingParams* s) {
  const json* v = Find(body, "seed");
  if (!v) return absl::OkStatus();
  if (v->is_number_unsigned()) {
    s->set_seed(v->get<uint64_t>());
  } else if (v->is_number_integer()) {
    s->set_seed(static_cast<uint64_t>(v->get<int64_t>()));  // negative seeds wrap, reproducibly
  } else {
    int64_t x = 0;
    if (absl::Status st = ToInt(*v, "seed", std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), &x);
        !st.ok()) {
      return st;
    }
    s->set_seed(static_cast<uint64_t>(x));
  }
  return absl::OkStatus();
}

absl::Status GetStop(const json& body, v1::GenerateRequest* r) {
  const json* v = Find(body, "stop");
  if (!v) return absl::OkStatus();
  if (v->is_string()) {
    r->add_stop(v->get<std::string>());
    return absl::OkStatus();
  }
  if (!v->is_array()) return InvalidType("stop", "a string or an array of strings");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) return InvalidType(absl::StrCat("stop[", i, "]"), "a string");
    r->add_stop((*v)[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status GetStreamOptions(const json& body, OpenAIRequest* out) {
  if (absl::Status s = GetBool(body, "stream", &out->stream); !s.ok()) return s;
  const json* v = Find(body, "stream_options");
  if (!v) return absl::OkStatus();
  if (!out->stream) {
    return InvalidParam("stream_options", "stream_options: only allowed when stream is true");
  }
  if (!v->is_object()) return InvalidType("stream_options", "an object");
  for (const auto& [key, value] : v->items()) {
    if (key != "include_usage" && !value.is_null()) {
      return UnsupportedParam(absl::StrCat("stream_options.", key));
    }
  }
  if (const json* u = Find(*v, "include_usage")) {
    if (!u->is_boolean()) return InvalidType("stream_options.include_usage", "a boolean");
    out->include_usage = u->get<bool>();
  }
  return absl::OkStatus();
}

absl::Status GetSampling(const json& body, v1::SamplingParams* s) {
  std::optional<float> temperature, top_p, presence, frequency, min_p, repetition;
  for (auto [key, into] :
       {std::pair{"temperature", &temperature}, std::pair{"top_p", &top_p},
        std::pair{"presence_penalty", &presence}, std::pair{"frequency_penalty", &frequency},
        std::pair{"min_p", &min_p}, std::pair{"repetition_penalty", &repetition}}) {
    if (absl::Status st = GetFloat(body, key, into); !st.ok()) return st;
  }
  if (temperature) s->set_temperature(*temperature);
  if (top_p) s->set_top_p(*top_p);
  if (presence) s->set_presence_penalty(*presence);
  if (frequency) s->set_frequency_penalty(*frequency);
  if (min_p) s->set_min_p(*min_p);
  if (repetition) s->set_repetition_penalty(*repetition);
  std::optional<int64_t> top_k;
  if (absl::Status st = GetInt(body, "top_k", -1, kMaxI32, &top_k); !st.ok()) return st;
  if (top_k && *top_k > 0) s->set_top_k(static_cast<uint32_t>(*top_k));  // -1 and 0: off
  return GetSeed(body, s);
}

// What both endpoints share: model, streaming, n, sampling, stop, user.
absl::Status ParseCommon(const json& body, const RequestOptions& options, OpenAIRequest* out,
                         v1::GenerateRequest* base) {
  const json* model = Find(body, "model");
  if (!model) {
    return InvalidParam("model", "you must provide a model parameter",
                        "missing_required_parameter");
  }
  if (!model->is_string()) return InvalidType("model", "a string");
  out->model = model->get<std::string>();
  if (absl::Status s = GetStreamOptions(body, out); !s.ok()) return s;
  std::optional<int64_t> n;
  if (absl::Status s = GetInt(body, "n", 1, options.max_choices, &n); !s.ok()) return s;
  out->n = static_cast<int>(n.value_or(1));
  if (absl::Status s = GetSampling(body, base->mutable_sampling()); !s.ok()) return s;
  if (absl::Status s = GetStop(body, base); !s.ok()) return s;
  bool ignore_eos = false;
  if (absl::Status s = GetBool(body, "ignore_eos", &ignore_eos); !s.ok()) return s;
  base->set_ignore_eos(ignore_eos);
  return GetString(body, "user", &out->user);
}

ParamNames CommonNames() {
  ParamNames names;
  for (const char* f : {"temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                        "presence_penalty", "frequency_penalty", "seed"}) {
    names.renames.emplace_back(absl::StrCat("sampling.", f), f);
  }
  names.renames.emplace_back("request_id", "user");
  return names;
}

// ---- chat ----

absl::Status ParseContent(const json& content, const std::string& field, const std::string& role,
                          std::string* out) {
  if (content.is_null() && role == "assistant") return absl::OkStatus();
  if (content.is_string()) {
    *out = content.get<std::string>();
    return absl::OkStatus();
  }
  if (!content.is_array()) return InvalidType(field, "a string or an array of content parts");
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string part_field = absl::StrCat(field, "[", j, "]");
    if (!part.is_object()) return InvalidType(part_field, "an object");
    const json* type = Find(part, "type");
    if (!type || !type->is_string()) return InvalidType(part_field + ".type", "a string");
    if (*type != "text") {
      return UnsupportedParam(part_field + ".type",
                              absl::StrCat("content part type '", type->get<std::string>(),
                                           "'; only 'text' parts are supported"));
    }
    for (const auto& [key, value] : part.items()) {
      if (key != "type" && key != "text" && !value.is_null()) {
        return UnsupportedParam(absl::StrCat(part_field, ".", key));
      }
    }
    const json* text = Find(part, "text");
    if (!text || !text->is_string()) return InvalidType(part_field + ".text", "a string");
    if (j > 0) out->push_back('\n');
    out->append(text->get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseMessage(const json& m, size_t i, v1::ChatMessage* out) {
  const std::string field = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return InvalidType(field, "an object");
  // Optional string fields, passed to the chat format as they are.
  const std::pair<const char*, std::string*> strings[] = {
      {"name", out->mutable_name()}, {"tool_call_id", out->mutable_tool_call_id()}};
  for (const auto& [key, value] : m.items()) {
    const bool known = key == "role" || key == "content" ||
                       std::any_of(std::begin(strings), std::end(strings),
                                   [&](const auto& s) { return key == s.first; });
    if (!known && !value.is_null()) return UnsupportedParam(absl::StrCat(field, ".", key));
  }
  for (const auto& [key, to] : strings) {
    const json* v = Find(m, key);
    if (!v) continue;
    if (!v->is_string()) return InvalidType(absl::StrCat(field, ".", key), "a string");
    *to = v->get<std::string>();
  }
  const json* role = Find(m, "role");
  if (!role || !role->is_string()) return InvalidType(field + ".role", "a string");
  std::string r = role->get<std::string>();
  if (r == "developer") r = "system";  // OpenAI's newer name for the system role
  if (r == "function") return UnsupportedParam(field + ".role", "role 'function'");
  out->set_role(r);
  auto content = m.find("content");
  if (content == m.end()) {
    return InvalidParam(field + ".content", absl::StrCat(field, ".content: required"),
                        "missing_required_parameter");
  }
  return ParseContent(*content, field + ".content", r, out->mutable_content());
}

absl::Status ParseMessages(const json& body, v1::ChatMessages* out) {
  const json* v = Find(body, "messages");
  if (!v) {
    return InvalidParam("messages", "Missing required parameter: 'messages'.",
                        "missing_required_parameter");
  }
  if (!v->is_array()) return InvalidType("messages", "an array of messages");
  if (v->empty()) return InvalidParam("messages", "messages: must not be empty", "empty_array");
  for (size_t i = 0; i < v->size(); ++i) {
    if (absl::Status s = ParseMessage((*v)[i], i, out->add_messages()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// max_completion_tokens or its older name max_tokens; returns the name the client used.
absl::StatusOr<std::string> ChatMaxTokens(const json& body, const RequestOptions& options,
                                          OpenAIRequest* out, v1::GenerateRequest* r) {
  std::optional<int64_t> mct, mt;
  if (absl::Status s = GetInt(body, "max_completion_tokens", 1, kMaxU32, &mct); !s.ok()) return s;
  if (absl::Status s = GetInt(body, "max_tokens", 1, kMaxU32, &mt); !s.ok()) return s;
  if (mct && mt && *mct != *mt) {
    return InvalidParam("max_tokens", "max_tokens and max_completion_tokens differ; set one");
  }
  r->set_max_tokens(static_cast<uint32_t>(mct.value_or(mt.value_or(options.default_max_tokens))));
  out->default_max_tokens = !mct && !mt;
  return mct ? "max_completion_tokens" : "max_tokens";
}

absl::Status ChatLogprobs(const json& body, OpenAIRequest* out, v1::GenerateRequest* r) {
  bool logprobs = false;
  if (absl::Status s = GetBool(body, "logprobs", &logprobs); !s.ok()) return s;
  std::optional<int64_t> top;
  if (absl::Status s = GetInt(body, "top_logprobs", 0, kMaxI32, &top); !s.ok()) return s;
  if (top && !logprobs) {
    return InvalidParam("top_logprobs", "top_logprobs: requires logprobs to be true");
  }
  if (logprobs) {
    out->top_logprobs = static_cast<int>(top.value_or(0));
    r->set_logprobs(static_cast<uint32_t>(std::max(out->top_logprobs, 1)));
  }
  return absl::OkStatus();
}

absl::Status ParseChat(const json& body, const RequestOptions& options, OpenAIRequest* out,
                       v1::GenerateRequest* base, ParamNames* names) {
  if (absl::Status s = ParseMessages(body, base->mutable_chat()); !s.ok()) return s;
  auto max_name = ChatMaxTokens(body, options, out, base);
  if (!max_name.ok()) return max_name.status();
  if (absl::Status s = ChatLogprobs(body, out, base); !s.ok()) return s;
  names->renames.insert(names->renames.end(), {{"chat.messages", "messages"},
                                               {"chat", "messages"},
                                               {"prompt", "messages"},
                                               {"max_tokens", *max_name},
                                               {"logprobs", "top_logprobs"}});
  return absl::OkStatus();
}

// ---- completions ----

absl::Status ToTokenIds(const json& list, const std::string& field, v1::TokenIds* out) {
  for (size_t i = 0; i < list.size(); ++i) {
    int64_t id = 0;
    if (absl::Status s = ToInt(list[i], absl::StrCat(field, "[", i, "]"), 0, kMaxU32, &id);
        !s.ok()) {
      return s;
    }
    out->add_ids(static_cast<uint32_t>(id));
  }
  return absl::OkStatus();
}

// `prompt`: a string, a list of strings, a list of token ids, or a list of token-id lists.
// Each prompt is a GenerateRequest with only its prompt set, and the parameter it is named by.
absl::Status ParsePrompts(const json& body,
                          std::vector<std::pair<v1::GenerateRequest, std::string>>* out) {
  const json* v = Find(body, "prompt");
  if (!v) {
    return InvalidParam("prompt", "Missing required parameter: 'prompt'.",
                        "missing_required_parameter");
  }
  if (v->is_string()) {
    out->emplace_back().first.set_text(v->get<std::string>());
    out->back().second = "prompt";
    return absl::OkStatus();
  }
  const char* kinds =
      "a string, an array of strings, an array of token ids or an array of arrays "
      "of token ids";
  if (!v->is_array()) return InvalidType("prompt", kinds);
  if (v->empty()) return InvalidParam("prompt", "prompt: must not be empty", "empty_array");
  if ((*v)[0].is_number()) {
    out->emplace_back().second = "prompt";
    return ToTokenIds(*v, "prompt", out->back().first.mutable_token_ids());
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& p = (*v)[i];
    auto& [request, name] = out->emplace_back();
    name = absl::StrCat("prompt[", i, "]");
    if (p.is_string()) {
      // Checked here, not left to the server: by the time the server refused one prompt the
      // others' streams would have started, to be cancelled (and counted as client cancels).
      if (p.get_ref<const std::string&>().empty()) {
        return InvalidParam(name, absl::StrCat(name, ": must not be empty"));
      }
      request.set_text(p.get<std::string>());
    } else if (p.is_array() && !p.empty()) {
      if (absl::Status s = ToTokenIds(p, name, request.mutable_token_ids()); !s.ok()) return s;
    } else {
      return InvalidType(name, "a string or a non-empty array of token ids");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseCompletions(const json& body, OpenAIRequest* out, v1::GenerateRequest* base,
                              ParamNames* names) {
  std::optional<int64_t> max_tokens, logprobs, best_of;
  if (absl::Status s = GetInt(body, "max_tokens", 1, kMaxU32, &max_tokens); !s.ok()) return s;
  base->set_max_tokens(static_cast<uint32_t>(max_tokens.value_or(16)));  // OpenAI's default
  out->default_max_tokens = !max_tokens;
  if (absl::Status s = GetInt(body, "logprobs", 0, kMaxI32, &logprobs); !s.ok()) return s;
  if (logprobs) {
    out->top_logprobs = static_cast<int>(*logprobs);
    base->set_logprobs(static_cast<uint32_t>(std::max(out->top_logprobs, 1)));
  }
  if (absl::Status s = GetInt(body, "best_of", 1, kMaxI32, &best_of); !s.ok()) return s;
  if (best_of && *best_of != out->n) {
    return UnsupportedParam("best_of", "only best_of equal to n: every candidate is returned");
  }
  names->renames.insert(names->renames.end(),
                        {{"max_tokens", "max_tokens"}, {"logprobs", "logprobs"}});
  return absl::OkStatus();
}

absl::Status Translate(Endpoint endpoint, const json& body, const RequestOptions& options,
                       OpenAIRequest* out) {
  if (!body.is_object()) return InvalidType("body", "a JSON object");
  if (absl::Status s = CheckKeys(endpoint, body); !s.ok()) return s;
  out->endpoint = endpoint;
  v1::GenerateRequest base;
  if (absl::Status s = ParseCommon(body, options, out, &base); !s.ok()) return s;
  ParamNames names = CommonNames();
  std::vector<std::pair<v1::GenerateRequest, std::string>> prompts;
  if (endpoint == Endpoint::kChat) {
    if (absl::Status s = ParseChat(body, options, out, &base, &names); !s.ok()) return s;
    prompts.emplace_back(v1::GenerateRequest(), "messages");
  } else {
    if (absl::Status s = ParseCompletions(body, out, &base, &names); !s.ok()) return s;
    if (absl::Status s = ParsePrompts(body, &prompts); !s.ok()) return s;
  }
  if (static_cast<int64_t>(prompts.size()) * out->n > options.max_choices) {
    return InvalidParam("n", absl::StrCat("n: ", prompts.size(), " prompts x n ", out->n,
                                          " exceeds ", options.max_choices, " choices"));
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int i = 0; i < out->n; ++i) {
      ChoiceRequest& c = out->choices.emplace_back();
      c.request = base;
      if (endpoint == Endpoint::kCompletions) c.request.MergeFrom(prompts[p].first);
      if (base.sampling().has_seed()) {
        c.request.mutable_sampling()->set_seed(base.sampling().seed() + static_cast<uint64_t>(i));
      }
      c.prompt_index = static_cast<int>(p);
      c.names = names;
      if (endpoint == Endpoint::kCompletions) {
        for (const char* f : {"text", "token_ids.ids", "token_ids", "prompt"}) {
          c.names.renames.emplace_back(f, prompts[p].second);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAIRequest> ParseOpenAIRequest(Endpoint endpoint, std::string_view body,
                                                 const RequestOptions& options) {
  // No exceptions leave nlohmann: parse errors give a discarded value, and every access below
  // checks the type first.
  const json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return InvalidParam("",
                        "We could not parse the JSON body of your request. The body must be "
                        "valid JSON (UTF-8).",
                        "invalid_json");
  }
  OpenAIRequest out;
  if (absl::Status s = Translate(endpoint, parsed, options, &out); !s.ok()) return s;
  return out;
}

}  // namespace kimi::gateway
