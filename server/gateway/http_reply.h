// Writing JSON and OpenAI-shaped errors into an httplib response.
#pragma once

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include <httplib.h>

namespace kimi::gateway {

void SendJson(httplib::Response& res, int status, const nlohmann::json& body);
// The status as OpenAI's error JSON with its HTTP status (errors.h has the table); 429 and 503 also
// get `Retry-After: 1`.
void SendError(httplib::Response& res, const absl::Status& status);

}  // namespace kimi::gateway
