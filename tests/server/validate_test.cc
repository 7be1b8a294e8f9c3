#include "server/validate.h"

#include "gtest/gtest.h"
#include "tests/engine/test_models.h"

namespace kimi::server {
namespace {

class ValidateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string dir = kimi::testing::PresetDir("k3-tiny");
    config_ = new ModelConfig(*LoadModelConfig(dir));
    config_->max_context = 64;  // small, to test the context check
    tok_ = tokenizer::Tokenizer::Load(dir)->release();
  }
  internal::GenerateRequest Good() {
    internal::GenerateRequest r;
    r.set_text("hello");
    r.set_max_tokens(8);
    return r;
  }
  std::string Error(const internal::GenerateRequest& r) {
    auto v = ValidateGenerate(r, server_, *config_, *tok_);
    if (v.ok()) return "";
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(v.status().message());
  }
  ServerConfig server_;
  static ModelConfig* config_;
  static tokenizer::Tokenizer* tok_;
};
ModelConfig* ValidateTest::config_ = nullptr;
tokenizer::Tokenizer* ValidateTest::tok_ = nullptr;

TEST_F(ValidateTest, GoodRequestsPass) {
  auto v = ValidateGenerate(Good(), server_, *config_, *tok_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->spec.prompt.empty());
  EXPECT_FLOAT_EQ(v->spec.sampling.temperature, 1.0f);  // unset: 1
  EXPECT_FLOAT_EQ(v->spec.sampling.top_p, 1.0f);
  EXPECT_FALSE(v->spec.stop_token_ids.empty());  // the model's end-of-turn ids
  internal::GenerateRequest r = Good();
  r.mutable_chat()->add_messages()->set_role("user");
  r.mutable_chat()->mutable_messages(0)->set_content("hi");
  EXPECT_TRUE(ValidateGenerate(r, server_, *config_, *tok_).ok());
  r = Good();
  r.set_ignore_eos(true);
  EXPECT_TRUE(ValidateGenerate(r, server_, *config_, *tok_)->spec.stop_token_ids.empty());
}

// A message's name and a tool result's call id reach the chat format (prompt as the tokenizer
// renders the same messages).
TEST_F(ValidateTest, ChatNamesAndToolCallIdsAreRendered) {
  internal::GenerateRequest r = Good();
  auto* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("what is 6 x 7?");
  m->set_name("alice");
  m = r.mutable_chat()->add_messages();
  m->set_role("tool");
  m->set_content("42");
  m->set_tool_call_id("functions.mul:0");
  config_->max_context = 4096;
  auto v = ValidateGenerate(r, server_, *config_, *tok_);
  config_->max_context = 64;
  ASSERT_TRUE(v.ok()) << v.status();
  auto want = tok_->RenderChat(
      {{"user", "what is 6 x 7?", "alice", {}, ""}, {"tool", "42", "", {}, "functions.mul:0"}});
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(v->spec.prompt, *want);
  auto plain =
      tok_->RenderChat({{"user", "what is 6 x 7?", "", {}, ""}, {"tool", "42", "", {}, ""}});
  EXPECT_NE(v->spec.prompt, *plain);  // the two fields change the prompt
  r.mutable_chat()->mutable_messages(1)->set_tool_call_id("\xff");
  EXPECT_EQ(Error(r), "chat.messages[1].tool_call_id: not valid UTF-8");
}

// Every bad input names its field and the allowed range.
TEST_F(ValidateTest, BadInputsNameTheField) {
  auto with = [&](auto edit) {
    internal::GenerateRequest r = Good();
    edit(r);
    return Error(r);
  };
  EXPECT_EQ(with([](auto& r) { r.clear_prompt(); }),
            "prompt: one of text, token_ids or chat is required");
  EXPECT_EQ(with([](auto& r) { r.set_text(""); }), "text: must not be empty");
  EXPECT_EQ(with([](auto& r) { r.set_text("bad \xff\xfe utf8"); }), "text: not valid UTF-8");
  EXPECT_EQ(with([](auto& r) { r.set_text("\xed\xa0\x80"); }), "text: not valid UTF-8");  // surrogate
  EXPECT_EQ(with([](auto& r) { r.set_text(std::string(500, 'a') + " " + std::string(500, 'b')); })
                .rfind("prompt: ", 0),
            0u);
  EXPECT_EQ(with([](auto& r) { r.set_max_tokens(0); }), "max_tokens: must be in [1, 4096], got 0");
  EXPECT_EQ(with([](auto& r) { r.set_max_tokens(5000); }),
            "max_tokens: must be in [1, 4096], got 5000");
  EXPECT_EQ(with([](auto& r) { r.mutable_sampling()->set_temperature(-0.5f); }),
            "sampling.temperature: must be in [0, 100] (0 = greedy)");
  EXPECT_EQ(with([](auto& r) { r.mutable_sampling()->set_top_p(0.0f); }),
            "sampling.top_p: must be in (0, 1]");
  EXPECT_EQ(with([](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }),
            "sampling.top_p: must be in (0, 1]");
  EXPECT_EQ(with([](auto& r) { r.mutable_sampling()->set_min_p(2.0f); }),
            "sampling.min_p: must be in [0, 1]");
  EXPECT_EQ(with([](auto& r) { r.mutable_sampling()->set_presence_penalty(3.0f); }),
            "sampling.presence_penalty: must be in [-2, 2]");
  EXPECT_NE(with([](auto& r) { r.mutable_sampling()->set_top_k(1 << 30); }).find("sampling.top_k"),
            std::string::npos);
  EXPECT_NE(with([](auto& r) { r.mutable_token_ids()->add_ids(1u << 30); })
                .find("token_ids.ids[0]: 1073741824 is not a token id"),
            std::string::npos);
  EXPECT_EQ(with([](auto& r) { r.mutable_token_ids(); }), "token_ids.ids: must not be empty");
  EXPECT_EQ(with([](auto& r) {
              for (int i = 0; i < 9; ++i) r.add_stop("x");
            }),
            "stop: at most 8 stop strings, got 9");
  EXPECT_EQ(with([](auto& r) { r.add_stop(""); }), "stop[0]: must not be empty");
  EXPECT_EQ(with([](auto& r) { r.add_stop(std::string(300, 's')); }),
            "stop[0]: at most 256 bytes");
  EXPECT_EQ(with([](auto& r) { r.set_logprobs(21); }), "logprobs: must be in [0, 20]");
  EXPECT_EQ(with([](auto& r) { r.mutable_chat(); }), "chat.messages: must not be empty");
  EXPECT_EQ(with([](auto& r) { r.mutable_chat()->add_messages()->set_role("robot"); }),
            "chat.messages[0].role: must be one of system, user, assistant, tool");
  EXPECT_EQ(with([](auto& r) { r.add_stop_token_ids(1u << 30); }),
            "stop_token_ids[0]: must be < " + std::to_string(config_->vocab));
  EXPECT_EQ(with([](auto& r) { r.set_request_id(std::string(300, 'i')); }),
            "request_id: at most 256 bytes");
}

TEST(Utf8, Definition) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("h\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xe4\xb8"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

}  // namespace
}  // namespace kimi::server
