// What the HTTP handlers share, built once in main() and alive as long as the HTTP server.
#pragma once

#include <atomic>
#include <string>

#include "server/auth.h"
#include "server/gateway/backend_client.h"
#include "server/gateway/openai_request.h"
#include "server/gateway/served_model.h"
#include "server/gateway/token_bytes.h"

namespace kimi::gateway {

struct Gateway {
  BackendClient* backend = nullptr;
  ServedModel* model = nullptr;
  TokenBytes* token_bytes = nullptr;
  RequestOptions request_options;
  // The gateway's own keys (--api-keys-file). Disabled: the client's Authorization header goes to
  // the backend as is. Enabled: the client must present one of them, and the backend gets
  // `backend_authorization` ("Bearer KEY" from --backend-api-key-file, or nothing).
  server::ApiKeys keys;
  std::string backend_authorization;
  // SIGTERM: first `draining` (new requests and /health get 503, open ones go on), then, when
  // they are done or the drain time is up, `stopping` (waiting handlers give up).
  std::atomic<bool> draining{false};
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> open_requests{0};  // completion requests being answered
};

}  // namespace kimi::gateway
