#include "tokenizer/tokenizer.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "tests/tokenizer/test_util.h"

namespace kimi::tokenizer {
namespace {

using testing::ByteRanks;
using testing::Cl100kRanks;
using testing::Msg;
using testing::WriteModelDir;

TEST(Tokenizer, LoadsAKimiLinearCheckpoint) {
  const std::string dir = WriteModelDir("load_kl", ByteRanks({"he", "ll", "hell", "hello"}), false);
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t base = 260;
  EXPECT_EQ((*tok)->num_base_tokens(), base);
  EXPECT_EQ((*tok)->vocab_size(), base + 256);
  EXPECT_EQ((*tok)->TokenId("<|im_end|>"), base + 2);
  EXPECT_EQ((*tok)->TokenId("<|im_middle|>"), base + 17);
  EXPECT_EQ((*tok)->TokenText(base + 17), "<|im_middle|>");
  EXPECT_EQ((*tok)->TokenText(base + 5), "<|reserved_token_" + std::to_string(base + 5) + "|>");
  // [EOS], <|im_end|> (= config eos_token_id), [EOT]
  EXPECT_EQ((*tok)->stop_token_ids(), (std::vector<int32_t>{base + 1, base + 2, base + 9}));
  EXPECT_FALSE((*tok)->has_chat_template());
  EXPECT_EQ((*tok)->Encode("hello", false), (std::vector<int32_t>{259}));
}

TEST(Tokenizer, LoadsAK3CheckpointWithItsOwnStopSet) {
  const std::string dir = WriteModelDir("load_k3", ByteRanks(), true);
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->TokenId("<|end_of_msg|>"), 258);
  EXPECT_FALSE((*tok)->TokenId("<|im_end|>").has_value());
  EXPECT_EQ((*tok)->stop_token_ids(), (std::vector<int32_t>{257, 258, 265}));
  // No template and no Kimi Linear tokens: chat fails clearly instead of guessing.
  auto chat = (*tok)->RenderChat({Msg("user", "hi")});
  EXPECT_EQ(chat.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  auto missing = Tokenizer::Load("/nonexistent/dir");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  const std::string dir = WriteModelDir("load_bad", ByteRanks(), false);
  testing::WriteText(dir + "/tiktoken.model", "garbage\n");
  auto bad = Tokenizer::Load(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tiktoken.model"), std::string::npos);
  const std::string dir2 =
      WriteModelDir("load_bad_tmpl", ByteRanks(), false, "{% macro x() %}{% endmacro %}");
  auto bad_template = Tokenizer::Load(dir2);
  ASSERT_FALSE(bad_template.ok());
  EXPECT_NE(bad_template.status().message().find("macro"), std::string::npos);
  // An empty template, or a directory in its place, loaded and then failed every chat prompt; an
  // end-of-turn id no token has would never stop anything.
  const std::string empty = WriteModelDir("load_empty_tmpl", ByteRanks(), false, "\n");
  auto empty_template = Tokenizer::Load(empty);
  ASSERT_FALSE(empty_template.ok());
  EXPECT_NE(empty_template.status().message().find("chat_template.jinja: the template is empty"),
            std::string::npos)
      << empty_template.status();
  const std::string folder = WriteModelDir("load_dir_tmpl", ByteRanks(), false);
  std::filesystem::create_directory(folder + "/chat_template.jinja");
  auto folder_template = Tokenizer::Load(folder);
  ASSERT_FALSE(folder_template.ok());
  EXPECT_NE(folder_template.status().message().find("not a regular file"), std::string::npos);
  // A template whose markers the checkpoint lacks (K3's <|open|> on Kimi Linear's tokens) would
  // write them as text.
  const std::string markers =
      WriteModelDir("load_tmpl_markers", ByteRanks(), false, "<|open|>{{ messages }}<|im_end|>");
  auto unknown_marker = Tokenizer::Load(markers);
  ASSERT_FALSE(unknown_marker.ok());
  EXPECT_NE(unknown_marker.status().message().find("writes <|open|>, which tokenizer_config.json"),
            std::string::npos)
      << unknown_marker.status();
  EXPECT_TRUE(
      Tokenizer::Load(WriteModelDir("load_tmpl_known", ByteRanks(), true, "<|open|>{{ x }}<|sep|>"))
          .ok());
  const std::string eos = WriteModelDir("load_bad_eos", ByteRanks(), false);
  testing::WriteText(eos + "/generation_config.json", R"({"eos_token_id": 99999999999})");
  auto bad_eos = Tokenizer::Load(eos);
  ASSERT_FALSE(bad_eos.ok());
  EXPECT_NE(bad_eos.status().message().find("is not a token id"), std::string::npos)
      << bad_eos.status();
}

TEST(Tokenizer, SpecialTokensOnlyWhereAllowed) {
  const std::string dir = WriteModelDir("special", Cl100kRanks(), false);
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t im_end = *(*tok)->TokenId("<|im_end|>");
  EXPECT_EQ(im_end, 100256 + 2);
  EXPECT_EQ((*tok)->Encode("hello<|im_end|> world", true),
            (std::vector<int32_t>{15339, im_end, 1917}));
  const auto plain = (*tok)->Encode("hello<|im_end|> world", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_end), 0);
  EXPECT_EQ((*tok)->Decode(plain), "hello<|im_end|> world");
  EXPECT_EQ((*tok)->Encode("hello world", false), (std::vector<int32_t>{15339, 1917}));
}

TEST(Tokenizer, RoundTripsArbitraryBytesAndIgnoresUnknownIds) {
  const std::string dir = WriteModelDir("bytes", Cl100kRanks(), false);
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok());
  std::string all;
  for (int i = 0; i < 3; ++i) {
    for (int b = 0; b < 256; ++b) all += static_cast<char>((b * 7 + i) & 0xFF);
  }
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(all, true)), all);
  const std::vector<int32_t> odd = {-5, 15339, 1 << 30, 100256 + 999};
  EXPECT_EQ((*tok)->Decode(odd), "hello");
  EXPECT_EQ((*tok)->TokenText(-1), "");
  EXPECT_TRUE((*tok)->Encode("", true).empty());
}

// tokenization_kimi.py cuts runs of more than 25,000 whitespace or non-whitespace characters;
// the ids equal encoding each cut part on its own.
TEST(Tokenizer, LongRunsAreCutLikeTokenizationKimi) {
  const std::string dir = WriteModelDir("runs", Cl100kRanks(), false);
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok());
  const std::string a(25000, 'a'), b(10, 'a'), sp(30000, ' ');
  auto cat = [](std::vector<int32_t> x, const std::vector<int32_t>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  // "x" + 25,010 a's: the cut comes after the 25,000th non-space char ("x" + 24,999 a's).
  const std::string text = "x" + a + b;
  const auto want = cat((*tok)->Encode("x" + a.substr(1), false), (*tok)->Encode("a" + b, false));
  EXPECT_EQ((*tok)->Encode(text, false), want);
  const std::string spaces = "hi" + sp + "yo";
  const auto want2 = cat((*tok)->Encode("hi" + sp.substr(0, 25000), false),
                         (*tok)->Encode(sp.substr(25000) + "yo", false));
  EXPECT_EQ((*tok)->Encode(spaces, false), want2);
  EXPECT_EQ((*tok)->Decode((*tok)->Encode(spaces, false)), spaces);
}

TEST(Tokenizer, FromPartsRejectsSpecialsOnBaseRanks) {
  EXPECT_FALSE(Tokenizer::FromParts(ByteRanks(), "\\p{L}+", {{"<x>", 5, true}}).ok());
  EXPECT_TRUE(Tokenizer::FromParts(ByteRanks(), "\\p{L}+", {{"<x>", 256, true}}).ok());
  EXPECT_FALSE(Tokenizer::FromParts(ByteRanks(), "\\w+", {}).ok());
}

}  // namespace
}  // namespace kimi::tokenizer
