#include "tokenizer/special_tokens.h"

#include <gtest/gtest.h>

namespace kimi::tokenizer {
namespace {

TEST(SpecialTokens, ReadsAddedTokensAndReservesTheRest) {
  const char* cfg = R"({
    "added_tokens_decoder": {
      "1000": {"content": "[BOS]", "special": true},
      "1002": {"content": "<|im_end|>", "special": true},
      "1011": {"content": "<|tool_calls_section_begin|>", "special": false}
    },
    "eos_token": {"content": "<|im_end|>"}
  })";
  auto s = SpecialTokens::FromTokenizerConfig(cfg, 1000);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->all().size(), 256u);
  EXPECT_EQ(s->Id("<|im_end|>"), 1002);
  EXPECT_EQ(s->Id("<|reserved_token_1001|>"), 1001);
  EXPECT_EQ(s->Id("<|reserved_token_1255|>"), 1255);
  EXPECT_FALSE(s->Id("<|reserved_token_1256|>").has_value());
  EXPECT_FALSE(s->Find(1011)->special);
  EXPECT_EQ(s->eos_token(), "<|im_end|>");
}

TEST(SpecialTokens, FindsLeftmostThenLongest) {
  auto s = SpecialTokens::FromList({{"<|a|>", 10, true}, {"<|a|>x", 11, true}, {"[B]", 12, true}});
  ASSERT_TRUE(s.ok());
  size_t b = 0, e = 0;
  int32_t id = 0;
  ASSERT_TRUE(s->FindNext("xx[B]<|a|>x", 0, &b, &e, &id));
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(id, 12);
  ASSERT_TRUE(s->FindNext("xx[B]<|a|>x", e, &b, &e, &id));
  EXPECT_EQ(id, 11);
  EXPECT_EQ(e, 11u);
  EXPECT_FALSE(s->FindNext("<|a|", 0, &b, &e, &id));
}

TEST(SpecialTokens, RejectsBadConfigs) {
  EXPECT_FALSE(SpecialTokens::FromTokenizerConfig("not json", 10).ok());
  EXPECT_FALSE(SpecialTokens::FromTokenizerConfig("[]", 10).ok());
  EXPECT_FALSE(
      SpecialTokens::FromTokenizerConfig(R"({"added_tokens_decoder": {"x": {}}})", 10).ok());
  EXPECT_FALSE(SpecialTokens::FromTokenizerConfig(
                   R"({"added_tokens_decoder": {"5": {"content": "<a>"}}})", 10)
                   .ok());  // inside the base ranks
  EXPECT_FALSE(
      SpecialTokens::FromTokenizerConfig(
          R"({"added_tokens_decoder": {"10": {"content": "<a>"}, "11": {"content": "<a>"}}})",
          10)
          .ok());  // repeated text
  EXPECT_FALSE(SpecialTokens::FromList({{"", 1, true}}).ok());
}

}  // namespace
}  // namespace kimi::tokenizer
