// Every field of a request is checked here before anything reaches the scheduler. Errors are
// INVALID_ARGUMENT whose message starts with the field's name and states the allowed range.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "kimi/internal/wire.pb.h"
#include "scheduler/request.h"
#include "server/config.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kimi::server {

struct ValidatedRequest {
  sched::RequestSpec spec;  // id left empty: the server assigns one
  std::vector<std::string> stop_strings;
  std::string client_id;
  std::string prompt_text;  // for logs when logging.log_prompts is on
};

absl::StatusOr<ValidatedRequest> ValidateGenerate(const internal::GenerateRequest& req,
                                                  const ServerConfig& config,
                                                  const ModelConfig& model,
                                                  const tokenizer::Tokenizer& tok);

using tokenizer::IsValidUtf8;

}  // namespace kimi::server
