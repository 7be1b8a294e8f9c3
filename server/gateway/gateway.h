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
  std::atomic<bool> stopping{false};  // set on SIGTERM: waiting handlers give up
};

}  // namespace kimi::gateway
