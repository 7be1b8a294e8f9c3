#include "server/gateway/errors.h"

#include "gtest/gtest.h"

namespace kimi::gateway {
namespace {

using json = nlohmann::json;

TEST(Errors, StatusCodesMapOnce) {
  const std::pair<grpc::StatusCode, int> table[] = {
      {grpc::StatusCode::INVALID_ARGUMENT, 400},   {grpc::StatusCode::UNAUTHENTICATED, 401},
      {grpc::StatusCode::PERMISSION_DENIED, 403},  {grpc::StatusCode::NOT_FOUND, 404},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, 429}, {grpc::StatusCode::UNAVAILABLE, 503},
      {grpc::StatusCode::DEADLINE_EXCEEDED, 504},  {grpc::StatusCode::INTERNAL, 500},
      {grpc::StatusCode::CANCELLED, 500},          {grpc::StatusCode::UNKNOWN, 500}};
  for (const auto& [code, http] : table) {
    EXPECT_EQ(ToHttpError(FromGrpc(grpc::Status(code, "oops"))).status, http) << code;
  }
}

TEST(Errors, BodyHasOpenAIShape) {
  const HttpError e = ToHttpError(
      FromGrpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full: 1 requests")));
  EXPECT_EQ(e.status, 429);
  EXPECT_EQ(e.body, json({{"error",
                           {{"message", "queue full: 1 requests"},
                            {"type", "rate_limit_error"},
                            {"param", nullptr},
                            {"code", "rate_limit_exceeded"}}}}));
  const HttpError down = ToHttpError(FromGrpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")));
  EXPECT_EQ(down.body["error"]["type"], "server_error");
  EXPECT_EQ(down.body["error"]["code"], "service_unavailable");
}

// gRPC's own message-size check also answers RESOURCE_EXHAUSTED: that is the request's size, not
// a rate limit a client should retry.
TEST(Errors, AMessageOverTheBackendsSizeLimitIsTooLarge) {
  const HttpError e =
      ToHttpError(FromGrpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                        "Received message larger than max (5242918 vs. 4194304)")));
  EXPECT_EQ(e.status, 413);
  EXPECT_EQ(e.body, json({{"error",
                           {{"message",
                             "The request is too large for the backend (its "
                             "server.max_request_bytes): Received message larger than max "
                             "(5242918 vs. 4194304)"},
                            {"type", "invalid_request_error"},
                            {"param", nullptr},
                            {"code", "request_too_large"}}}}));
}

TEST(Errors, BackendFieldBecomesOpenAIParam) {
  ParamNames names;
  names.renames = {{"sampling.top_p", "top_p"},
                   {"chat.messages", "messages"},
                   {"chat", "messages"},
                   {"prompt", "messages"},
                   {"max_tokens", "max_completion_tokens"}};
  auto check = [&](const std::string& message, const std::string& param, const std::string& renamed,
                   const std::string& code) {
    const HttpError e =
        ToHttpError(FromGrpc(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message), names));
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.body["error"]["param"], param) << message;
    EXPECT_EQ(e.body["error"]["message"], renamed) << message;
    EXPECT_EQ(e.body["error"]["code"], code) << message;
  };
  check("sampling.top_p: must be in (0, 1]", "top_p", "top_p: must be in (0, 1]", "invalid_value");
  check("chat.messages[1].role: must be one of system, user, assistant, tool", "messages[1].role",
        "messages[1].role: must be one of system, user, assistant, tool", "invalid_value");
  check("max_tokens: must be in [1, 4096], got 5000", "max_completion_tokens",
        "max_completion_tokens: must be in [1, 4096], got 5000", "invalid_value");
  check("prompt: 70 tokens; the context limit is 64 (prompt must be shorter)", "messages",
        "messages: 70 tokens; the context limit is 64 (prompt must be shorter)",
        "context_length_exceeded");
  check("stop[0]: must not be empty", "stop[0]", "stop[0]: must not be empty", "invalid_value");
  // Not a field: no param.
  const HttpError plain = ToHttpError(
      FromGrpc(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad thing: with words"), names));
  EXPECT_TRUE(plain.body["error"]["param"].is_null());
}

TEST(Errors, RenameMatchesWholeFields) {
  ParamNames names;
  names.renames = {{"text", "prompt"}, {"token_ids", "prompt"}, {"token_ids.ids", "prompt[1]"}};
  EXPECT_EQ(names.Rename("text"), "prompt");
  EXPECT_EQ(names.Rename("textual"), "textual");
  EXPECT_EQ(names.Rename("token_ids.ids[4]"), "prompt[1][4]");  // the longest match wins
  EXPECT_EQ(names.Rename("other"), "other");
}

TEST(Errors, GatewayErrors) {
  HttpError e = ToHttpError(ModelNotFound("gpt-4"));
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.body["error"]["code"], "model_not_found");
  EXPECT_EQ(e.body["error"]["param"], "model");
  EXPECT_NE(e.body["error"]["message"].get<std::string>().find("gpt-4"), std::string::npos);
  e = ToHttpError(InvalidApiKey("Incorrect API key provided."));
  EXPECT_EQ(e.status, 401);
  EXPECT_EQ(e.body["error"]["code"], "invalid_api_key");
  EXPECT_EQ(e.body["error"]["type"], "invalid_request_error");
  e = ToHttpError(UnsupportedParam("tools"));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body["error"]["param"], "tools");
  EXPECT_EQ(e.body["error"]["code"], "unsupported_parameter");
  e = ToHttpError(absl::InternalError("boom"));
  EXPECT_EQ(e.status, 500);
  EXPECT_TRUE(e.body["error"]["code"].is_null());
}

}  // namespace
}  // namespace kimi::gateway
