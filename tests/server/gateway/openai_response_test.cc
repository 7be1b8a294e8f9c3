#include "server/gateway/openai_response.h"

#include <map>

#include "gtest/gtest.h"

namespace kimi::gateway {
namespace {

using json = nlohmann::json;

TokenPiece FakePiece(uint32_t id) { return {"t" + std::to_string(id), true}; }

ResponseMeta Meta(Endpoint e, int top_logprobs = -1, bool include_usage = false) {
  ResponseMeta m;
  m.endpoint = e;
  m.id = e == Endpoint::kChat ? "chatcmpl-1" : "cmpl-1";
  m.created = 1700000000;
  m.model = "k3-tiny";
  m.top_logprobs = top_logprobs;
  m.include_usage = include_usage;
  return m;
}

v1::GenerateResponse Message(const std::string& text, std::vector<uint32_t> ids,
                             v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED,
                             uint32_t prompt = 0, uint32_t completion = 0) {
  v1::GenerateResponse m;
  m.set_text(text);
  for (uint32_t id : ids) {
    m.add_token_ids(id);
    v1::TokenLogprob* lp = m.add_logprobs();
    lp->set_token_id(id);
    lp->set_logprob(-0.5f);
    for (uint32_t k = 0; k < 3; ++k) {
      v1::TopLogprob* top = lp->add_top();
      top->set_token_id(id + k);
      top->set_logprob(-0.5f - static_cast<float>(k));
    }
  }
  m.set_finish_reason(finish);
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    m.mutable_usage()->set_prompt_tokens(prompt);
    m.mutable_usage()->set_completion_tokens(completion);
  }
  return m;
}

TEST(OpenAIResponse, ChatCompletionWithUsageOverChoices) {
  std::vector<ChoiceResult> choices(2);
  choices[0].Add(Message("Hello", {1}), true);
  choices[0].Add(Message(" world", {2}, v1::FINISH_REASON_STOP, 5, 2), true);
  choices[1].Add(Message("Hi", {3}, v1::FINISH_REASON_LENGTH, 5, 1), true);
  const json j = CompletionJson(Meta(Endpoint::kChat), choices, /*n=*/2, FakePiece);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["model"], "k3-tiny");
  EXPECT_EQ(j["created"], 1700000000);
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  // One prompt, counted once; completion tokens summed.
  EXPECT_EQ(j["usage"],
            json({{"prompt_tokens", 5}, {"completion_tokens", 3}, {"total_tokens", 8}}));
}

TEST(OpenAIResponse, TextCompletionCountsEachPrompt) {
  std::vector<ChoiceResult> choices(4);
  for (int i = 0; i < 4; ++i) {
    choices[i].Add(Message("x", {1}, v1::FINISH_REASON_LENGTH, i < 2 ? 3 : 4, 1), true);
  }
  const json j = CompletionJson(Meta(Endpoint::kCompletions), choices, /*n=*/2, FakePiece);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][3]["text"], "x");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
}

TEST(OpenAIResponse, ChatLogprobsShowTopK) {
  std::vector<ChoiceResult> choices(1);
  choices[0].Add(Message("ab", {7, 8}, v1::FINISH_REASON_STOP, 1, 2), true);
  const json j = CompletionJson(Meta(Endpoint::kChat, /*top_logprobs=*/2), choices, 1, FakePiece);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "t7");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(content[0]["bytes"], json({'t', '7'}));
  ASSERT_EQ(content[1]["top_logprobs"].size(), 2u);  // the server sent 3; 2 were asked for
  EXPECT_EQ(content[1]["top_logprobs"][1]["token"], "t9");
  EXPECT_FLOAT_EQ(content[1]["top_logprobs"][1]["logprob"].get<float>(), -1.5f);
}

TEST(OpenAIResponse, CompletionLogprobsLegacyShape) {
  std::vector<ChoiceResult> choices(1);
  choices[0].Add(Message("ab", {7, 10}, v1::FINISH_REASON_STOP, 1, 2), true);
  const json j =
      CompletionJson(Meta(Endpoint::kCompletions, /*top_logprobs=*/1), choices, 1, FakePiece);
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"t7", "t10"}));
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
  ASSERT_EQ(lp["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp["top_logprobs"][1].size(), 1u);
  EXPECT_TRUE(lp["top_logprobs"][1].contains("t10"));
}

// Tokens that split a character ("é" is C3 A9, "日" E6 97 A5) carry their own bytes, and their
// names say so ("bytes:\xc3", as OpenAI writes them), rather than U+FFFD for each.
TEST(OpenAIResponse, TokensSplittingACharacterKeepTheirBytes) {
  const std::map<uint32_t, std::string> vocab = {
      {1, "\xC3"}, {2, "\xA9"}, {3, " \xE6\x97"}, {4, "\xA5!"}, {5, "ok"}};
  auto piece_of = [&](uint32_t id) { return TokenPiece{vocab.at(id), true}; };
  std::vector<ChoiceResult> choices(1);
  v1::GenerateResponse m = Message("é 日!", {1, 2, 3, 4}, v1::FINISH_REASON_STOP, 1, 4);
  for (int i = 0; i < 4; ++i) {  // the top alternatives: the other split halves, then "ok"
    m.mutable_logprobs(i)->clear_top();
    v1::TopLogprob* a = m.mutable_logprobs(i)->add_top();
    a->set_token_id(i % 2 == 0 ? 2 : 1);
    a->set_logprob(-2.0f);
    v1::TopLogprob* b = m.mutable_logprobs(i)->add_top();
    b->set_token_id(5);
    b->set_logprob(-3.0f);
  }
  choices[0].Add(m, true);
  EXPECT_EQ(choices[0].tokens_seen, 4u);
  const json chat = CompletionJson(Meta(Endpoint::kChat, 2), choices, 1, piece_of);
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 4u);
  EXPECT_EQ(content[0]["token"], "bytes:\\xc3");
  EXPECT_EQ(content[0]["bytes"], json({0xC3}));
  EXPECT_EQ(content[1]["bytes"], json({0xA9}));
  EXPECT_EQ(content[2]["token"], "bytes:\\x20\\xe6\\x97");
  EXPECT_EQ(content[2]["bytes"], json({0x20, 0xE6, 0x97}));
  EXPECT_EQ(content[3]["bytes"], json({0xA5, '!'}));
  EXPECT_EQ(content[0]["top_logprobs"][0]["bytes"], json({0xA9}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "ok");
  std::string joined;  // the bytes rebuild the text
  for (const json& t : content) {
    for (const json& b : t["bytes"]) joined += static_cast<char>(b.get<int>());
  }
  EXPECT_EQ(joined, "é 日!");

  const json legacy = CompletionJson(Meta(Endpoint::kCompletions, 2), choices, 1, piece_of);
  const json& lp = legacy["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"],
            json({"bytes:\\xc3", "bytes:\\xa9", "bytes:\\x20\\xe6\\x97", "bytes:\\xa5\\x21"}));
  // Offsets in characters of "é 日!": each token at the character its first byte falls in.
  EXPECT_EQ(lp["text_offset"], json({0, 0, 1, 2}));
  // Two alternatives and the chosen token: three distinct keys, not U+FFFD for each.
  EXPECT_EQ(lp["top_logprobs"][1].size(), 3u);
}

// Offsets index the text the server streams: a special token it leaves out takes no room, a byte
// that is no character's is one U+FFFD, as the server decodes it. And the legacy top_logprobs hold
// the chosen token beside the alternatives (OpenAI: up to logprobs + 1).
TEST(OpenAIResponse, TextOffsetsFollowTheStreamedText) {
  const std::map<uint32_t, TokenPiece> vocab = {
      {1, {"a", true}}, {2, {"<|im_end|>", false}}, {3, {"\x93", true}}, {4, {"bc", true}}};
  auto piece_of = [&](uint32_t id) { return vocab.at(id); };
  std::vector<ChoiceResult> choices(1);
  v1::GenerateResponse m = Message(
      "a\xEF\xBF\xBD"
      "bc",
      {1, 2, 3, 4}, v1::FINISH_REASON_STOP, 1, 4);
  for (int i = 0; i < 4; ++i) m.mutable_logprobs(i)->clear_top();
  choices[0].Add(m, true);
  const json legacy = CompletionJson(Meta(Endpoint::kCompletions, 0), choices, 1, piece_of);
  const json& lp = legacy["choices"][0]["logprobs"];
  EXPECT_EQ(lp["text_offset"], json({0, 1, 1, 2}));
  EXPECT_EQ(lp["tokens"], json({"a", "<|im_end|>", "bytes:\\x93", "bc"}));
  ASSERT_EQ(lp["top_logprobs"].size(), 4u);
  EXPECT_EQ(lp["top_logprobs"][0], json({{"a", -0.5}}));
  TextOffsets offsets;  // a character split over tokens starts where its first byte is
  EXPECT_EQ(offsets.Add({"x\xE6", true}), 0);
  EXPECT_EQ(offsets.Add({"\x97", true}), 1);
  EXPECT_EQ(offsets.Add({"\xA5y", true}), 1);
  EXPECT_EQ(offsets.Add({"z", true}), 3);
}

TEST(OpenAIResponse, ChatChunks) {
  const ResponseMeta meta = Meta(Endpoint::kChat, -1, /*include_usage=*/true);
  const json role = RoleChunk(meta, 1);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["index"], 1);
  EXPECT_EQ(role["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(role["usage"].is_null());
  TextOffsets offsets;
  auto delta = DeltaChunk(meta, 0, Message("Hel", {1}), FakePiece, &offsets);
  ASSERT_TRUE(delta.has_value());
  EXPECT_EQ((*delta)["choices"][0]["delta"], json({{"content", "Hel"}}));
  EXPECT_TRUE((*delta)["choices"][0]["finish_reason"].is_null());
  // Nothing to say (a held-back partial character, a skipped special token): no chunk.
  EXPECT_FALSE(DeltaChunk(meta, 0, Message("", {1}), FakePiece, &offsets).has_value());
  const json finish = FinishChunk(meta, 0, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(finish["choices"][0]["delta"], json::object());
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  const json usage = UsageChunk(meta, UsageJson(4, 6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 10);
}

TEST(OpenAIResponse, CompletionChunksCarryLogprobs) {
  const ResponseMeta meta = Meta(Endpoint::kCompletions, /*top_logprobs=*/0);
  TextOffsets offsets;
  EXPECT_EQ(offsets.Add({"abc", true}), 0);
  auto delta = DeltaChunk(meta, 2, Message("", {5}), FakePiece, &offsets);
  ASSERT_TRUE(delta.has_value());  // empty text, but its token's logprob is news
  EXPECT_EQ((*delta)["object"], "text_completion");
  EXPECT_EQ((*delta)["choices"][0]["index"], 2);
  EXPECT_EQ((*delta)["choices"][0]["text"], "");
  EXPECT_EQ((*delta)["choices"][0]["logprobs"]["text_offset"], json({3}));
  EXPECT_EQ(offsets.Add({"x", true}), 5);
  EXPECT_FALSE((*delta).contains("usage"));
  EXPECT_EQ(FinishChunk(meta, 2, v1::FINISH_REASON_STOP)["choices"][0]["text"], "");
}

TEST(OpenAIResponse, FinishReasonsAndSse) {
  EXPECT_EQ(FinishReasonJson(v1::FINISH_REASON_STOP), "stop");
  EXPECT_EQ(FinishReasonJson(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_TRUE(FinishReasonJson(v1::FINISH_REASON_CANCELLED).is_null());
  EXPECT_TRUE(FinishReasonJson(v1::FINISH_REASON_ERROR).is_null());
  EXPECT_EQ(SseData(json({{"a", 1}})), "data: {\"a\":1}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  // Invalid UTF-8 never throws; it is replaced.
  EXPECT_EQ(Dump(json(std::string("a\xff"))), "\"a\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace kimi::gateway
