// OpenAI request bodies -> kimi.v1.GenerateRequest. Checks every parameter: an unknown or
// unsupported one is an error naming it (never silently dropped), and so is a wrong type. Ranges
// the server checks (temperature, top_p, penalties, stop count, max_tokens limit, logprobs limit)
// are left to it, so one place owns each limit; its messages name kimi.v1 fields, which `names`
// maps back.
//
// Mapping (both endpoints unless noted):
//   messages (chat)            -> chat.messages (role developer -> system; text content parts
//   joined
//                                 with "\n"; other part types, tool calls and names are refused)
//   prompt (completions)       -> text, or token_ids for integer lists; a list of prompts gives one
//                                 prompt each
//   max_completion_tokens | max_tokens -> max_tokens (default: chat options.default_max_tokens,
//                                 completions 16, as OpenAI; the caller lowers a default to the
//                                 server's limit)
//   temperature, top_p, seed, presence_penalty, frequency_penalty -> sampling.*
//   stop (string or list)      -> stop
//   logprobs + top_logprobs (chat), logprobs K (completions) -> logprobs max(K, 1); shown: K
//   n                          -> n requests per prompt, seed + i when a seed is given
//   user                       -> part of request_id (server logs)
//   extensions (as vLLM): top_k, min_p, repetition_penalty, ignore_eos
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kimi/v1/generation.pb.h"
#include "server/gateway/errors.h"

namespace kimi::gateway {

enum class Endpoint { kChat, kCompletions };

struct RequestOptions {
  uint32_t default_max_tokens = 4096;  // chat requests that set no limit
  int max_choices = 128;               // n x prompts
};

// One choice: the request for its own Generate stream.
struct ChoiceRequest {
  v1::GenerateRequest request;  // request_id left to the caller
  int prompt_index = 0;         // which prompt (completions with a list of prompts)
  ParamNames names;             // kimi.v1 field -> OpenAI parameter, for backend errors
};

struct OpenAIRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;
  int top_logprobs = -1;  // alternatives shown per token; -1: no logprobs at all
  std::string user;
  bool default_max_tokens = false;     // the request set no limit: the default applies
  std::vector<ChoiceRequest> choices;  // index = prompt * n + i, as OpenAI orders them
};

// Parses and translates a request body. Errors are INVALID_ARGUMENT with `param` set.
absl::StatusOr<OpenAIRequest> ParseOpenAIRequest(Endpoint endpoint, std::string_view body,
                                                 const RequestOptions& options);

}  // namespace kimi::gateway
