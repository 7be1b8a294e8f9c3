// Errors in OpenAI's shape. Every failure in the gateway is an absl::Status; the OpenAI parameter
// it concerns and OpenAI's error code travel with it as payloads. This file is the one place where
// a status becomes an HTTP status and the body
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
// and where a backend gRPC status becomes an absl::Status named in OpenAI's terms:
//
//   gRPC / absl code        HTTP  type                    code (unless the status carries one)
//   INVALID_ARGUMENT         400  invalid_request_error   invalid_value (context_length_exceeded)
//   OUT_OF_RANGE             400  invalid_request_error   invalid_value
//   UNAUTHENTICATED          401  invalid_request_error   invalid_api_key
//   PERMISSION_DENIED        403  invalid_request_error   null
//   NOT_FOUND                404  invalid_request_error   null (model_not_found for `model`)
//   RESOURCE_EXHAUSTED       429  rate_limit_error        rate_limit_exceeded
//   UNAVAILABLE              503  server_error            service_unavailable
//   DEADLINE_EXCEEDED        504  server_error            timeout
//   anything else            500  server_error            null
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace kimi::gateway {

// Renames kimi.v1 request fields to the OpenAI parameters they came from, so that a backend error
// such as "sampling.top_p: must be in (0, 1]" names `top_p`. Each pair is a field prefix and its
// replacement, matched at a field boundary ('.', '[' or the end); the longest match wins.
struct ParamNames {
  std::vector<std::pair<std::string, std::string>> renames;
  std::string Rename(std::string_view field) const;
};

// The gateway's own errors.
absl::Status InvalidParam(std::string_view param, std::string_view message,
                          std::string_view code = "invalid_value");
absl::Status InvalidType(std::string_view param, std::string_view expected);
absl::Status UnsupportedParam(std::string_view param, std::string_view detail = "");
absl::Status ModelNotFound(std::string_view model);
// A request larger than the gateway or the backend accepts: HTTP 413, `request_too_large`.
absl::Status RequestTooLarge(std::string_view message);
absl::Status InvalidApiKey(std::string_view message);

// A status with OpenAI's `param` and `code` attached (empty: null).
absl::Status WithDetails(absl::Status status, std::string_view param, std::string_view code);
std::string ParamOf(const absl::Status& status);
std::string CodeOf(const absl::Status& status);

// A finished backend call's status in OpenAI's terms: the field its message starts with
// ("field: what is wrong") becomes `param`, renamed by `names`, and the message names it the same
// way.
absl::Status FromGrpc(const grpc::Status& status, const ParamNames& names = {});

struct HttpError {
  int status = 500;
  nlohmann::json body;  // {"error": {...}}
};
HttpError ToHttpError(const absl::Status& status);

}  // namespace kimi::gateway
