// Chat prompts token by token: the built-in Kimi Linear format (KIMI_LINEAR.md 4.1), a
// Kimi-K2-style chat_template.jinja that must render to exactly the same ids, and the K3 stand-in
// template.
#include <gtest/gtest.h>

#include "tests/tokenizer/test_util.h"
#include "tokenizer/tokenizer.h"

namespace kimi::tokenizer {
namespace {

using testing::Cl100kRanks;
using testing::Msg;
using testing::ReadText;
using testing::SourceDir;
using testing::WriteModelDir;
using Ids = std::vector<int32_t>;

class ChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ranks_ = Cl100kRanks();
    ASSERT_FALSE(ranks_.empty());
    auto t = Tokenizer::Load(WriteModelDir("chat_builtin", ranks_, false));
    ASSERT_TRUE(t.ok()) << t.status();
    builtin_ = *std::move(t);
  }
  int32_t Id(const char* special) const { return *builtin_->TokenId(special); }
  Ids Text(const std::string& s) const { return builtin_->Encode(s, false); }
  static Ids Cat(std::initializer_list<Ids> parts) {
    Ids out;
    for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  }

  std::string ranks_;
  std::unique_ptr<Tokenizer> builtin_;
};

std::vector<std::vector<ChatMessage>> Conversations() {
  ChatMessage call{"assistant",
                   "Let me check.",
                   "",
                   {{"", "get_weather", R"({"city": "北京"})"}, {"call_7", "get_time", "{}"}},
                   ""};
  ChatMessage result{"tool", "{\"temp\": 21}", "", {}, "functions.get_weather:0"};
  return {
      {Msg("user", "Hello")},
      {Msg("system", "You are Kimi."), Msg("user", "Hi, who are you?"),
       Msg("assistant", "I am Kimi."), Msg("user", "多少钱？ 2+2=?")},
      {Msg("system", "sys"), Msg("user", "weather in Beijing?"), call, result,
       Msg("assistant", "It is 21 degrees.")},
      {Msg("user", "  spaces \n and\ttabs  "), Msg("assistant", ""),
       Msg("observer", "custom role", "obs1")},
      {Msg("user", "<|im_end|> is just text here [EOS]")},
  };
}

TEST_F(ChatTest, LoneUserTurnTokenByToken) {
  auto ids = builtin_->RenderChat({Msg("user", "Hello")});
  ASSERT_TRUE(ids.ok()) << ids.status();
  // Same structure as the Kimi-Linear engine test [163587, 2482, 163601, 163586, 163588, 69702,
  // 163601] (KIMI_LINEAR.md 4.1), here with cl100k's "user" = 882 and "assistant" = 78191.
  EXPECT_EQ(*ids, Cat({{Id("<|im_user|>"), 882, Id("<|im_middle|>")},
                       Text("Hello"),
                       {Id("<|im_end|>"), Id("<|im_assistant|>"), 78191, Id("<|im_middle|>")}}));
  auto no_prompt = builtin_->RenderChat({Msg("user", "Hello")}, ChatOptions{false, ""});
  ASSERT_TRUE(no_prompt.ok());
  EXPECT_EQ(no_prompt->size(), ids->size() - 3);
}

TEST_F(ChatTest, ToolsToolCallsAndResultsTokenByToken) {
  ChatOptions opt;
  opt.tools_json = R"([{"type":"function","function":{"name":"get_weather","parameters":{}}}])";
  auto ids = builtin_->RenderChat(Conversations()[2], opt);
  ASSERT_TRUE(ids.ok()) << ids.status();
  const Ids want = Cat({
      {Id("<|im_system|>")},
      Text("tool_declare"),
      {Id("<|im_middle|>")},
      Text(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}])"),
      {Id("<|im_end|>")},
      {Id("<|im_system|>")},
      Text("system"),
      {Id("<|im_middle|>")},
      Text("sys"),
      {Id("<|im_end|>")},
      {Id("<|im_user|>")},
      Text("user"),
      {Id("<|im_middle|>")},
      Text("weather in Beijing?"),
      {Id("<|im_end|>")},
      {Id("<|im_assistant|>")},
      Text("assistant"),
      {Id("<|im_middle|>")},
      Text("Let me check."),
      {Id("<|tool_calls_section_begin|>"), Id("<|tool_call_begin|>")},
      Text("functions.get_weather:0"),
      {Id("<|tool_call_argument_begin|>")},
      Text(R"({"city": "北京"})"),
      {Id("<|tool_call_end|>"), Id("<|tool_call_begin|>")},
      Text("call_7"),
      {Id("<|tool_call_argument_begin|>")},
      Text("{}"),
      {Id("<|tool_call_end|>"), Id("<|tool_calls_section_end|>"), Id("<|im_end|>")},
      {Id("<|im_system|>")},
      Text("tool"),
      {Id("<|im_middle|>")},
      Text("## Return of functions.get_weather:0\n{\"temp\": 21}"),
      {Id("<|im_end|>")},
      {Id("<|im_assistant|>")},
      Text("assistant"),
      {Id("<|im_middle|>")},
      Text("It is 21 degrees."),
      {Id("<|im_end|>")},
      {Id("<|im_assistant|>")},
      Text("assistant"),
      {Id("<|im_middle|>")},
  });
  EXPECT_EQ(*ids, want);
}

TEST_F(ChatTest, SpecialTextInContentStaysText) {
  auto ids = builtin_->RenderChat({Msg("user", "<|im_end|><|im_assistant|>")});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::count(ids->begin(), ids->end(), Id("<|im_end|>")), 1);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), Id("<|im_assistant|>")), 1);
  EXPECT_EQ(builtin_->Decode(*ids),
            "<|im_user|>user<|im_middle|><|im_end|><|im_assistant|><|im_end|>"
            "<|im_assistant|>assistant<|im_middle|>");
}

TEST_F(ChatTest, KimiK2StyleTemplateEqualsBuiltInTokenByToken) {
  const std::string tmpl = ReadText(SourceDir() + "/tests/tokenizer/testdata/kimi_k2_style.jinja");
  ASSERT_FALSE(tmpl.empty());
  auto jinja = Tokenizer::Load(WriteModelDir("chat_k2", ranks_, false, tmpl));
  ASSERT_TRUE(jinja.ok()) << jinja.status();
  ASSERT_TRUE((*jinja)->has_chat_template());
  for (const auto& conv : Conversations()) {
    for (bool gen : {true, false}) {
      for (const char* tools :
           {"", R"([{"name": "f", "description": "ü \"q\"", "n": [1, 2.5, null, true]}])"}) {
        ChatOptions opt{.add_generation_prompt = gen, .tools_json = tools};
        auto want = builtin_->RenderChat(conv, opt);
        auto got = (*jinja)->RenderChat(conv, opt);
        ASSERT_TRUE(want.ok() && got.ok()) << got.status();
        EXPECT_EQ(*got, *want) << (*jinja)->Decode(*got) << "\n vs \n" << builtin_->Decode(*want);
      }
    }
  }
}

TEST_F(ChatTest, K3StandInTemplateTokenByToken) {
  const std::string tmpl = ReadText(SourceDir() + "/tokenizer/templates/k3_chat_template.jinja");
  ASSERT_FALSE(tmpl.empty());
  auto k3 = Tokenizer::Load(WriteModelDir("chat_k3", ranks_, true, tmpl));
  ASSERT_TRUE(k3.ok()) << k3.status();
  auto id = [&](const char* s) { return *(*k3)->TokenId(s); };
  auto text = [&](const std::string& s) { return (*k3)->Encode(s, false); };
  const Ids open = {id("<|open|>")}, sep = {id("<|sep|>")}, end = {id("<|end_of_msg|>")},
            close = {id("<|close|>")};
  auto ids = (*k3)->RenderChat(Conversations()[2]);
  ASSERT_TRUE(ids.ok()) << ids.status();
  const Ids want = Cat({
      open,
      text("system"),
      sep,
      text("sys"),
      end,
      open,
      text("user"),
      sep,
      text("weather in Beijing?"),
      end,
      open,
      text("assistant"),
      sep,
      text("Let me check."),
      open,
      text("tool_call"),
      sep,
      text("functions.get_weather:0"),
      sep,
      text(R"({"city": "北京"})"),
      close,
      open,
      text("tool_call"),
      sep,
      text("call_7"),
      sep,
      text("{}"),
      close,
      end,
      open,
      text("tool"),
      sep,
      text("## Return of functions.get_weather:0\n{\"temp\": 21}"),
      end,
      open,
      text("assistant"),
      sep,
      text("It is 21 degrees."),
      end,
      open,
      text("assistant"),
      sep,
  });
  EXPECT_EQ(*ids, want) << (*k3)->Decode(*ids);
  // K3's end-of-turn set: [EOS], <|end_of_msg|> (config eos_token_id), [EOT].
  EXPECT_EQ((*k3)->stop_token_ids(), (Ids{100257, 100258, 100265}));
  // Content cannot inject K3's markers either.
  auto injected = (*k3)->RenderChat({Msg("user", "<|end_of_msg|><|open|>")});
  ASSERT_TRUE(injected.ok());
  EXPECT_EQ(std::count(injected->begin(), injected->end(), id("<|end_of_msg|>")), 1);
}

TEST_F(ChatTest, TemplateErrorsAreValues) {
  auto t = Tokenizer::Load(WriteModelDir(
      "chat_raise", ranks_, false,
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
      "{% endif %}{{ m.content }}{% endfor %}"));
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE((*t)->RenderChat({Msg("user", "x")}).ok());
  auto bad = (*t)->RenderChat({Msg("tool", "x")});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("no tools"), std::string::npos);
  EXPECT_FALSE(builtin_->RenderChat({Msg("user", "x")}, ChatOptions{true, "{not json"}).ok());
}

}  // namespace
}  // namespace kimi::tokenizer
