#include "server/gateway/openai_request.h"

#include "gtest/gtest.h"

namespace kimi::gateway {
namespace {

OpenAIRequest Parse(Endpoint e, const std::string& body, RequestOptions options = {}) {
  auto r = ParseOpenAIRequest(e, body, options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAIRequest();
}

// The error's `param`, checking that it is an INVALID_ARGUMENT.
std::string ErrorParam(Endpoint e, const std::string& body, std::string* code = nullptr) {
  auto r = ParseOpenAIRequest(e, body, RequestOptions());
  if (r.ok()) return "<ok>";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  if (code) *code = CodeOf(r.status());
  return ParamOf(r.status());
}

constexpr Endpoint kChat = Endpoint::kChat;
constexpr Endpoint kCompletions = Endpoint::kCompletions;

TEST(OpenAIRequest, ChatMapsMessagesAndSampling) {
  const OpenAIRequest r = Parse(kChat, R"({
    "model": "k3-tiny",
    "messages": [
      {"role": "developer", "content": "Be terse."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null},
      {"role": "tool", "content": "42", "tool_call_id": "call_1", "name": "lookup"}],
    "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3,
    "presence_penalty": 0.25, "frequency_penalty": -0.5, "stop": "\n", "user": "alice",
    "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": true,
    "stream": true, "stream_options": {"include_usage": true}})");
  EXPECT_EQ(r.model, "k3-tiny");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "alice");
  EXPECT_EQ(r.top_logprobs, -1);
  ASSERT_EQ(r.choices.size(), 1u);
  const v1::GenerateRequest& g = r.choices[0].request;
  ASSERT_EQ(g.chat().messages_size(), 4);
  EXPECT_EQ(g.chat().messages(0).role(), "system");
  EXPECT_EQ(g.chat().messages(1).content(), "Hi\nthere");
  EXPECT_EQ(g.chat().messages(2).content(), "");
  EXPECT_EQ(g.chat().messages(3).role(), "tool");
  EXPECT_EQ(g.chat().messages(3).tool_call_id(), "call_1");
  EXPECT_EQ(g.chat().messages(3).name(), "lookup");
  EXPECT_EQ(g.max_tokens(), 7u);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().seed(), 3u);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.25f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.5f);
  EXPECT_EQ(g.sampling().top_k(), 40u);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.05f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_TRUE(g.ignore_eos());
  ASSERT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.stop(0), "\n");
  EXPECT_EQ(g.logprobs(), 0u);
}

TEST(OpenAIRequest, DefaultsAndNulls) {
  RequestOptions options;
  options.default_max_tokens = 99;
  const OpenAIRequest r = Parse(kChat, R"({"model": "m", "messages": [{"role": "user",
    "content": "x"}], "temperature": null, "tools": null, "stop": null, "n": null})",
                                options);
  const v1::GenerateRequest& g = r.choices[0].request;
  EXPECT_EQ(g.max_tokens(), 99u);
  EXPECT_FALSE(g.sampling().has_temperature());
  EXPECT_FALSE(g.sampling().has_seed());
  EXPECT_EQ(g.stop_size(), 0);
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.n, 1);
  const OpenAIRequest c = Parse(kCompletions, R"({"model": "m", "prompt": "x"})");
  EXPECT_EQ(c.choices[0].request.max_tokens(), 16u);  // OpenAI's default for completions
}

TEST(OpenAIRequest, NChoicesGetConsecutiveSeeds) {
  const OpenAIRequest r = Parse(kChat, R"({"model": "m", "n": 3, "seed": 10,
    "messages": [{"role": "user", "content": "x"}]})");
  ASSERT_EQ(r.choices.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.choices[i].request.sampling().seed(), 10u + i);
  const OpenAIRequest unseeded = Parse(kChat, R"({"model": "m", "n": 2,
    "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_FALSE(unseeded.choices[1].request.sampling().has_seed());
}

TEST(OpenAIRequest, ChatLogprobs) {
  OpenAIRequest r = Parse(kChat, R"({"model": "m", "logprobs": true, "top_logprobs": 3,
    "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_EQ(r.choices[0].request.logprobs(), 3u);
  r = Parse(kChat, R"({"model": "m", "logprobs": true, "messages": [{"role": "user",
    "content": "x"}]})");
  EXPECT_EQ(r.top_logprobs, 0);                    // the chosen token only ...
  EXPECT_EQ(r.choices[0].request.logprobs(), 1u);  // ... which the server sends with top-1
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "top_logprobs": 2, "messages": [{"role": "user",
    "content": "x"}]})"),
            "top_logprobs");
}

TEST(OpenAIRequest, CompletionPrompts) {
  OpenAIRequest r = Parse(kCompletions, R"({"model": "m", "prompt": ["a", "b"], "n": 2,
    "logprobs": 2, "stop": ["x", "y"]})");
  ASSERT_EQ(r.choices.size(), 4u);
  EXPECT_EQ(r.choices[0].request.text(), "a");
  EXPECT_EQ(r.choices[1].request.text(), "a");
  EXPECT_EQ(r.choices[2].request.text(), "b");
  EXPECT_EQ(r.choices[3].prompt_index, 1);
  EXPECT_EQ(r.choices[3].request.logprobs(), 2u);
  EXPECT_EQ(r.choices[3].request.stop_size(), 2);
  EXPECT_EQ(r.choices[2].names.Rename("text"), "prompt[1]");
  r = Parse(kCompletions, R"({"model": "m", "prompt": [1, 2, 3]})");
  ASSERT_EQ(r.choices.size(), 1u);
  EXPECT_EQ(r.choices[0].request.token_ids().ids_size(), 3);
  EXPECT_EQ(r.choices[0].names.Rename("token_ids.ids[2]"), "prompt[2]");
  r = Parse(kCompletions,
            R"({"model": "m", "prompt": [[1], [2, 3]], "best_of": 1, "echo": false})");
  ASSERT_EQ(r.choices.size(), 2u);
  EXPECT_EQ(r.choices[1].request.token_ids().ids(1), 3u);
}

TEST(OpenAIRequest, UnsupportedParametersAreNamed) {
  std::string code;
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function"}]})",
                       &code),
            "tools");
  EXPECT_EQ(code, "unsupported_parameter");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
    "response_format": {"type": "json_object"}})"),
            "response_format");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
    "temprature": 1})",
                       &code),
            "temprature");
  EXPECT_EQ(code, "unsupported_parameter");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": [
    {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "u"}}]}]})"),
            "messages[0].content[1].type");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "assistant", "content": null,
    "tool_calls": [{"id": "c1", "type": "function"}]}]})"),
            "messages[0].tool_calls");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x",
    "name": 5}]})"),
            "messages[0].name");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
    "stream": true, "stream_options": {"include_obfuscation": true}})"),
            "stream_options.include_obfuscation");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": "x", "echo": true})"), "echo");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": "x", "best_of": 3})"), "best_of");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": "x", "messages": []})"),
            "messages");
  // Harmless defaults pass.
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
    "tools": [], "response_format": {"type": "text"}, "logit_bias": {}, "store": false,
    "parallel_tool_calls": false, "modalities": ["text"]})"),
            "<ok>");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
    "modalities": ["text", "audio"]})"),
            "modalities");
}

TEST(OpenAIRequest, BadValuesAreNamed) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  std::string code;
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "temperature": "hot", )" + msgs + "}", &code),
            "temperature");
  EXPECT_EQ(code, "invalid_type");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "n": 0, )" + msgs + "}"), "n");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "n": 1.5, )" + msgs + "}"), "n");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "max_tokens": -1, )" + msgs + "}"), "max_tokens");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "max_tokens": 4, "max_completion_tokens": 5, )" +
                                  msgs + "}"),
            "max_tokens");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "stop": ["a", 1], )" + msgs + "}"), "stop[1]");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "stream_options": {}, )" + msgs + "}"),
            "stream_options");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "seed": "1", )" + msgs + "}"), "seed");
  EXPECT_EQ(ErrorParam(kChat, R"({"messages": [{"role": "user", "content": "x"}]})", &code),
            "model");
  EXPECT_EQ(code, "missing_required_parameter");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m"})"), "messages");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": []})"), "messages");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user"}]})"),
            "messages[0].content");
  EXPECT_EQ(ErrorParam(kChat, R"({"model": "m", "messages": [{"role": "user", "content": 5}]})"),
            "messages[0].content");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": [1, "a"]})"), "prompt[1]");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": [-1]})"), "prompt[0]");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": []})"), "prompt");
  // An empty prompt among others is refused before any stream starts.
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": ["ok", ""]})"), "prompt[1]");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": "x", "n": 100,
    "logprobs": -1})"),
            "logprobs");
  EXPECT_EQ(ErrorParam(kCompletions, R"({"model": "m", "prompt": ["a", "b"], "n": 100})"), "n");
  EXPECT_EQ(ErrorParam(kChat, "{not json", &code), "");
  EXPECT_EQ(code, "invalid_json");
  EXPECT_EQ(ErrorParam(kChat, "[1, 2]"), "body");
}

// The gateway checks only what the wire cannot carry; the server checks its own limits (max_tokens
// against limits.max_tokens, top_logprobs against 20). Below the range the gateway states the
// lower bound alone, so one field never gets two different ranges from the two.
TEST(OpenAIRequest, RangeMessagesStateNoWireBoundAsALimit) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  auto message = [&](const std::string& field) {
    auto r = ParseOpenAIRequest(kChat, R"({"model": "m", )" + field + ", " + msgs + "}", {});
    return r.ok() ? std::string("<ok>") : std::string(r.status().message());
  };
  EXPECT_EQ(message(R"("max_tokens": 0)"), "max_tokens: must be >= 1, got 0");
  EXPECT_EQ(message(R"("logprobs": true, "top_logprobs": -1)"),
            "top_logprobs: must be >= 0, got -1");
  EXPECT_EQ(message(R"("top_k": -3)"), "top_k: must be >= -1, got -3");
  EXPECT_EQ(message(R"("max_tokens": 5000000000)"),
            "max_tokens: must be at most 4294967295 (the API's integer), got 5000000000");
  EXPECT_EQ(message(R"("n": 0)"), "n: must be in [1, 128], got 0");  // the gateway's own limit
}

TEST(OpenAIRequest, NegativeAndLargeSeedsAreReproducible) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  EXPECT_EQ(Parse(kChat, R"({"model": "m", "seed": -1, )" + msgs + "}")
                .choices[0]
                .request.sampling()
                .seed(),
            UINT64_MAX);
  EXPECT_EQ(Parse(kChat, R"({"model": "m", "seed": 18446744073709551615, )" + msgs + "}")
                .choices[0]
                .request.sampling()
                .seed(),
            UINT64_MAX);
}

TEST(OpenAIRequest, BackendFieldsMapToOpenAINames) {
  const OpenAIRequest r = Parse(kChat, R"({"model": "m", "max_completion_tokens": 3,
    "messages": [{"role": "user", "content": "x"}]})");
  const ParamNames& names = r.choices[0].names;
  EXPECT_EQ(names.Rename("sampling.top_p"), "top_p");
  EXPECT_EQ(names.Rename("chat.messages[1].role"), "messages[1].role");
  EXPECT_EQ(names.Rename("max_tokens"), "max_completion_tokens");
  EXPECT_EQ(names.Rename("logprobs"), "top_logprobs");
  EXPECT_EQ(names.Rename("prompt"), "messages");
  EXPECT_EQ(names.Rename("stop[2]"), "stop[2]");
  EXPECT_EQ(names.Rename("request_id"), "user");
}

}  // namespace
}  // namespace kimi::gateway
