// The gateway's HTTP routes:
//   GET  /health                 200 {"status":"ok"} once the backend's grpc.health.v1 Check says
//                                SERVING; 503 before that (loading, draining, unreachable)
//   GET  /v1/models              the backend's model (GetModelInfo), OpenAI's list shape
//   GET  /v1/models/{model}      that model, or 404 model_not_found
//   POST /v1/chat/completions    completion_handler.h
//   POST /v1/completions         completion_handler.h
// Anything else is an OpenAI-shaped 404. Every handler runs inside a catch-all: an exception from
// a library becomes a 500, never a dead connection thread.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "server/gateway/gateway.h"
#include <httplib.h>

namespace kimi::gateway {

// The largest request body accepted (larger ones get 413 request_too_large), counted after
// decompression.
inline constexpr size_t kMaxBodyBytes = 16u << 20;

// The longest Authorization value passed to the backend: gRPC refuses metadata over 8 KiB with
// RESOURCE_EXHAUSTED, which would reach the client as a retryable 429.
inline constexpr size_t kMaxAuthorizationBytes = 4096;

// OK when `value` can go to the backend as gRPC metadata: printable ASCII (gRPC's core aborts the
// process on anything else) and at most kMaxAuthorizationBytes.
absl::Status CheckMetadataValue(std::string_view value);

void AddRoutes(httplib::Server& server, Gateway& gateway);

}  // namespace kimi::gateway
