#include "server/validate.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace kimi::server {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

bool InRange(float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; }

absl::Status CheckText(const std::string& field, const std::string& text, bool allow_empty) {
  if (!IsValidUtf8(text)) return Bad(field, "not valid UTF-8");
  if (!allow_empty && text.empty()) return Bad(field, "must not be empty");
  return absl::OkStatus();
}

absl::Status CheckSampling(const v1::SamplingParams& s, const ModelConfig& model,
                           sched::SamplingParams* out) {
  out->temperature = s.has_temperature() ? s.temperature() : 1.0f;
  if (!InRange(out->temperature, 0.0f, 100.0f)) {
    return Bad("sampling.temperature", "must be in [0, 100] (0 = greedy)");
  }
  out->top_p = s.has_top_p() ? s.top_p() : 1.0f;
  if (!std::isfinite(out->top_p) || out->top_p <= 0.0f || out->top_p > 1.0f) {
    return Bad("sampling.top_p", "must be in (0, 1]");
  }
  if (s.top_k() > static_cast<uint32_t>(model.vocab)) {
    return Bad("sampling.top_k", absl::StrCat("must be in [0, ", model.vocab, "] (0 = off)"));
  }
  out->top_k = static_cast<int32_t>(s.top_k());
  if (!InRange(s.min_p(), 0.0f, 1.0f)) return Bad("sampling.min_p", "must be in [0, 1]");
  out->min_p = s.min_p();
  const float rep = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  if (!InRange(rep, 1e-6f, 10.0f)) {
    return Bad("sampling.repetition_penalty", "must be in (0, 10] (0 or 1 = off)");
  }
  out->repetition_penalty = rep;
  if (!InRange(s.presence_penalty(), -2.0f, 2.0f)) {
    return Bad("sampling.presence_penalty", "must be in [-2, 2]");
  }
  if (!InRange(s.frequency_penalty(), -2.0f, 2.0f)) {
    return Bad("sampling.frequency_penalty", "must be in [-2, 2]");
  }
  out->presence_penalty = s.presence_penalty();
  out->frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) {
    out->seed = s.seed();
  } else {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    out->seed = rng();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ValidatedRequest> ValidateGenerate(const internal::GenerateRequest& req,
                                                  const ServerConfig& config,
                                                  const ModelConfig& model,
                                                  const tokenizer::Tokenizer& tok) {
  ValidatedRequest out;
  if (req.request_id().size() > 256) return Bad("request_id", "at most 256 bytes");
  if (absl::Status s = CheckText("request_id", req.request_id(), true); !s.ok()) return s;
  out.client_id = req.request_id();

  std::vector<int32_t>& prompt = out.spec.prompt;
  switch (req.prompt_case()) {
    case internal::GenerateRequest::kText:
      if (absl::Status s = CheckText("text", req.text(), false); !s.ok()) return s;
      prompt = tok.Encode(req.text(), /*allow_special=*/true);
      out.prompt_text = req.text();
      break;
    case internal::GenerateRequest::kTokenIds: {
      const auto& ids = req.token_ids().ids();
      if (ids.empty()) return Bad("token_ids.ids", "must not be empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] >= static_cast<uint32_t>(model.vocab)) {
          return Bad(absl::StrCat("token_ids.ids[", i, "]"),
                     absl::StrCat(ids[i], " is not a token id (must be < ", model.vocab, ")"));
        }
        prompt.push_back(static_cast<int32_t>(ids[i]));
      }
      break;
    }
    case internal::GenerateRequest::kChat: {
      const auto& msgs = req.chat().messages();
      if (msgs.empty()) return Bad("chat.messages", "must not be empty");
      std::vector<tokenizer::ChatMessage> chat;
      for (int i = 0; i < msgs.size(); ++i) {
        const std::string field = absl::StrCat("chat.messages[", i, "]");
        const std::string& role = msgs[i].role();
        if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
          return Bad(field + ".role", "must be one of system, user, assistant, tool");
        }
        if (absl::Status s = CheckText(field + ".content", msgs[i].content(), true); !s.ok()) {
          return s;
        }
        for (const auto& [name, text] : {std::pair{".name", &msgs[i].name()},
                                         std::pair{".tool_call_id", &msgs[i].tool_call_id()}}) {
          if (absl::Status s = CheckText(field + name, *text, true); !s.ok()) return s;
        }
        chat.push_back({role, msgs[i].content(), msgs[i].name(), {}, msgs[i].tool_call_id()});
        absl::StrAppend(&out.prompt_text, role, ": ", msgs[i].content(), "\n");
      }
      auto ids = tok.RenderChat(chat);
      if (!ids.ok()) return Bad("chat", std::string(ids.status().message()));
      prompt = std::move(*ids);
      break;
    }
    case internal::GenerateRequest::PROMPT_NOT_SET:
      return Bad("prompt", "one of text, token_ids or chat is required");
  }
  if (prompt.empty()) return Bad("prompt", "encodes to no tokens");
  if (static_cast<int64_t>(prompt.size()) >= model.max_context) {
    return Bad("prompt", absl::StrCat(prompt.size(), " tokens; the context limit is ",
                                      model.max_context, " (prompt must be shorter)"));
  }
  if (req.max_tokens() < 1 || req.max_tokens() > static_cast<uint32_t>(config.max_tokens)) {
    return Bad("max_tokens", absl::StrCat("must be in [1, ", config.max_tokens, "], got ",
                                          req.max_tokens()));
  }
  out.spec.max_tokens = static_cast<int32_t>(req.max_tokens());
  if (absl::Status s = CheckSampling(req.sampling(), model, &out.spec.sampling); !s.ok()) return s;
  if (req.logprobs() > static_cast<uint32_t>(config.max_logprobs)) {
    return Bad("logprobs", absl::StrCat("must be in [0, ", config.max_logprobs, "]"));
  }
  out.spec.sampling.logprobs = static_cast<int32_t>(req.logprobs());
  out.spec.sampling.want_logprobs = req.logprobs() > 0;
  if (req.stop_size() > config.max_stop_strings) {
    return Bad("stop", absl::StrCat("at most ", config.max_stop_strings, " stop strings, got ",
                                    req.stop_size()));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string field = absl::StrCat("stop[", i, "]");
    if (absl::Status s = CheckText(field, req.stop(i), false); !s.ok()) return s;
    if (static_cast<int64_t>(req.stop(i).size()) > config.max_stop_string_bytes) {
      return Bad(field, absl::StrCat("at most ", config.max_stop_string_bytes, " bytes"));
    }
    out.stop_strings.push_back(req.stop(i));
  }
  for (int i = 0; i < req.stop_token_ids_size(); ++i) {
    if (req.stop_token_ids(i) >= static_cast<uint32_t>(model.vocab)) {
      return Bad(absl::StrCat("stop_token_ids[", i, "]"),
                 absl::StrCat("must be < ", model.vocab));
    }
    out.spec.stop_token_ids.push_back(static_cast<int32_t>(req.stop_token_ids(i)));
  }
  if (!req.ignore_eos()) {
    for (int32_t id : tok.stop_token_ids()) out.spec.stop_token_ids.push_back(id);
  }
  out.spec.priority = req.priority();
  return out;
}

}  // namespace kimi::server
