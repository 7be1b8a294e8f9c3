#include "server/gateway/errors.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kimi::gateway {
namespace {

constexpr char kParamUrl[] = "type.kimi.dev/gateway.param";
constexpr char kCodeUrl[] = "type.kimi.dev/gateway.code";
constexpr char kRequestTooLarge[] = "request_too_large";

std::string Payload(const absl::Status& s, const char* url) {
  auto p = s.GetPayload(url);  // absl::optional (Debian's abseil has its own)
  return p ? std::string(*p) : std::string();
}

bool IsFieldChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '[' || c == ']';
}

// The field a server message starts with ("sampling.top_p: must be ..."), or empty.
std::string_view LeadingField(std::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == std::string_view::npos || colon == 0) return {};
  for (size_t i = 0; i < colon; ++i) {
    if (!IsFieldChar(message[i])) return {};
  }
  return message.substr(0, colon);
}

struct Shape {
  int http;
  const char* type;
  const char* code;  // default OpenAI code, or nullptr
};

Shape ShapeOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return {400, "invalid_request_error", "invalid_value"};
    case absl::StatusCode::kUnauthenticated:
      return {401, "invalid_request_error", "invalid_api_key"};
    case absl::StatusCode::kPermissionDenied:
      return {403, "invalid_request_error", nullptr};
    case absl::StatusCode::kNotFound:
      return {404, "invalid_request_error", nullptr};
    case absl::StatusCode::kResourceExhausted:
      return {429, "rate_limit_error", "rate_limit_exceeded"};
    case absl::StatusCode::kUnavailable:
      return {503, "server_error", "service_unavailable"};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, "server_error", "timeout"};
    default:
      break;
  }
  return {500, "server_error", nullptr};
}

nlohmann::json NullIfEmpty(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}

}  // namespace

std::string ParamNames::Rename(std::string_view field) const {
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& r : renames) {
    const std::string& from = r.first;
    if (field.substr(0, from.size()) != from) continue;
    if (field.size() > from.size() && field[from.size()] != '.' && field[from.size()] != '[') {
      continue;
    }
    if (!best || from.size() > best->first.size()) best = &r;
  }
  if (!best) return std::string(field);
  return absl::StrCat(best->second, std::string(field.substr(best->first.size())));
}

absl::Status WithDetails(absl::Status status, std::string_view param, std::string_view code) {
  if (!param.empty()) status.SetPayload(kParamUrl, absl::Cord(std::string(param)));
  if (!code.empty()) status.SetPayload(kCodeUrl, absl::Cord(std::string(code)));
  return status;
}

std::string ParamOf(const absl::Status& status) { return Payload(status, kParamUrl); }
std::string CodeOf(const absl::Status& status) { return Payload(status, kCodeUrl); }

absl::Status InvalidParam(std::string_view param, std::string_view message, std::string_view code) {
  return WithDetails(absl::InvalidArgumentError(std::string(message)), param, code);
}

absl::Status InvalidType(std::string_view param, std::string_view expected) {
  return InvalidParam(param,
                      absl::StrCat("Invalid type for '", std::string(param), "': expected ",
                                   std::string(expected), "."),
                      "invalid_type");
}

absl::Status UnsupportedParam(std::string_view param, std::string_view detail) {
  std::string message = absl::StrCat("Unsupported parameter: '", std::string(param),
                                     "' is not supported by kimi-gateway");
  if (!detail.empty()) absl::StrAppend(&message, " (", std::string(detail), ")");
  absl::StrAppend(&message, ".");
  return InvalidParam(param, message, "unsupported_parameter");
}

absl::Status ModelNotFound(std::string_view model) {
  return WithDetails(
      absl::NotFoundError(absl::StrCat("The model `", std::string(model),
                                       "` does not exist or you do not have access to it.")),
      "model", "model_not_found");
}

absl::Status RequestTooLarge(std::string_view message) {
  return WithDetails(absl::InvalidArgumentError(std::string(message)), "", kRequestTooLarge);
}

absl::Status InvalidApiKey(std::string_view message) {
  return WithDetails(absl::UnauthenticatedError(std::string(message)), "", "invalid_api_key");
}

absl::Status FromGrpc(const grpc::Status& status, const ParamNames& names) {
  if (status.ok()) return absl::OkStatus();
  // absl and gRPC share the canonical code numbering (google.rpc.Code).
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  const std::string& message = status.error_message();
  // gRPC's own size check (the server's max_request_bytes) answers RESOURCE_EXHAUSTED, which
  // would read as a rate limit (429, retried by clients): the request itself is too large.
  if (code == absl::StatusCode::kResourceExhausted &&
      absl::StartsWith(message, "Received message larger than max")) {
    return RequestTooLarge(absl::StrCat(
        "The request is too large for the backend (its server.max_request_bytes): ", message));
  }
  const std::string_view field = LeadingField(message);
  if (field.empty()) return absl::Status(code, message);
  const std::string param = names.Rename(field);
  const std::string renamed = absl::StrCat(param, message.substr(field.size()));
  std::string openai_code;
  if (code == absl::StatusCode::kInvalidArgument &&
      message.find("context limit") != std::string::npos) {
    openai_code = "context_length_exceeded";
  }
  return WithDetails(absl::Status(code, renamed), param, openai_code);
}

HttpError ToHttpError(const absl::Status& status) {
  const Shape shape = ShapeOf(status.code());
  std::string code = CodeOf(status);
  if (code.empty() && shape.code) code = shape.code;
  HttpError e;
  e.status = code == kRequestTooLarge ? 413 : shape.http;
  e.body = {{"error",
             {{"message", std::string(status.message())},
              {"type", shape.type},
              {"param", NullIfEmpty(ParamOf(status))},
              {"code", NullIfEmpty(code)}}}};
  return e;
}

}  // namespace kimi::gateway
