// The PCRE2 rewrite of Kimi's pattern, on cases derived from the pattern's definition: Han runs
// never join letters of other scripts, the letter alternatives take the Han-free letters and marks,
// digits go three at a time, punctuation takes one leading space, and Rust-vs-PCRE2 differences
// (\s, script names) are rewritten. Agreement with tiktoken's own engine on random text is in
// tiktoken_crosscheck.js.
#include "tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kimi::tokenizer {
namespace {

std::vector<std::string> Pieces(const Pretokenizer& p, const std::string& text) {
  std::vector<std::string> out;
  p.Split(text, [&](absl::string_view piece) { out.emplace_back(piece); });
  return out;
}

std::unique_ptr<Pretokenizer> Kimi() {
  auto pattern = TranslatePattern(kKimiPattern);
  EXPECT_TRUE(pattern.ok()) << pattern.status();
  auto p = Pretokenizer::Create(*pattern);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

using V = std::vector<std::string>;

TEST(KimiPattern, RewriteIsOneClassPerIntersection) {
  auto pattern = TranslatePattern(kKimiPattern);
  ASSERT_TRUE(pattern.ok());
  EXPECT_EQ(pattern->find("&&"), std::string::npos);
  EXPECT_NE(pattern->find(R"([^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}])"), std::string::npos);
  EXPECT_NE(pattern->find(R"([^\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}])"),
            std::string::npos);
  EXPECT_EQ(pattern->find(R"(\s)"), std::string::npos);  // \s replaced by White_Space
}

TEST(KimiPattern, HanRunsAreTheirOwnPieces) {
  auto p = Kimi();
  EXPECT_EQ(Pieces(*p, "你好world"), (V{"你好", "world"}));
  EXPECT_EQ(Pieces(*p, "Hello世界"), (V{"Hello", "世界"}));
  EXPECT_EQ(Pieces(*p, "abc中文def"), (V{"abc", "中文", "def"}));
  // cl100k would give " 中文" as one piece; Kimi's letter alternatives exclude Han.
  EXPECT_EQ(Pieces(*p, " 中文"), (V{" ", "中文"}));
  EXPECT_EQ(Pieces(*p, "。你好，世界！"), (V{"。", "你好", "，", "世界", "！"}));
  EXPECT_EQ(Pieces(*p, "漢字かなカナ"), (V{"漢字", "かなカナ"}));  // kana are Lo, not Han
  EXPECT_EQ(Pieces(*p, "中2024年"), (V{"中", "202", "4", "年"}));
  EXPECT_EQ(Pieces(*p, "x中y"), (V{"x", "中", "y"}));
  EXPECT_EQ(Pieces(*p, "é中é"), (V{"é", "中", "é"}));
}

TEST(KimiPattern, HanIsTheScriptNotScriptExtensions) {
  auto p = Kimi();
  // U+3005 々 is Script=Han. U+3001 、 is Script=Common with Han in its Script_Extensions, which
  // PCRE2's bare \p{Han} would use: then "日本、日本" would be one piece.
  EXPECT_EQ(Pieces(*p, "日本々、日本"), (V{"日本々", "、", "日本"}));
  EXPECT_EQ(Pieces(*p, "ーー日本"), (V{"ーー", "日本"}));  // U+30FC: Lm, Common
  EXPECT_EQ(Pieces(*p, "〇一"), (V{"〇一"}));              // U+3007 is Nl but Script=Han
}

TEST(KimiPattern, LetterCaseAlternatives) {
  auto p = Kimi();
  EXPECT_EQ(Pieces(*p, "CamelCase"), (V{"Camel", "Case"}));
  EXPECT_EQ(Pieces(*p, "HTTPServer"), (V{"HTTPServer"}));
  EXPECT_EQ(Pieces(*p, "ǅemal ǈ"), (V{"ǅemal", " ǈ"}));  // titlecase Lt
  EXPECT_EQ(Pieces(*p, "naïve café"), (V{"naïve", " café"}));
  EXPECT_EQ(Pieces(*p, "e\xcc\x81t\xcc\x88"), (V{"e\xcc\x81t\xcc\x88"}));  // marks join letters
  EXPECT_EQ(Pieces(*p, "ΑΘΗΝΑ αθηνα"), (V{"ΑΘΗΝΑ", " αθηνα"}));
}

TEST(KimiPattern, ContractionsAreCaseInsensitiveWithUnicodeFolding) {
  auto p = Kimi();
  EXPECT_EQ(Pieces(*p, "don't"), (V{"don't"}));
  EXPECT_EQ(Pieces(*p, "DON'T"), (V{"DON'T"}));
  EXPECT_EQ(Pieces(*p, "we'LL"), (V{"we'LL"}));
  // Rust's (?i) folds s with U+017F ſ; PCRE2 caseless UTF matching does too.
  EXPECT_EQ(Pieces(*p, "it'ſ"), (V{"it'ſ"}));
  EXPECT_EQ(Pieces(*p, "it'x"), (V{"it", "'x"}));
}

TEST(KimiPattern, DigitsPunctuationAndWhitespace) {
  auto p = Kimi();
  EXPECT_EQ(Pieces(*p, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(Pieces(*p, "abc123"), (V{"abc", "123"}));
  EXPECT_EQ(Pieces(*p, "a, b!!\n\nc"), (V{"a", ",", " b", "!!\n\n", "c"}));
  EXPECT_EQ(Pieces(*p, "x   y"), (V{"x", "  ", " y"}));
  EXPECT_EQ(Pieces(*p, "x  \n  y"), (V{"x", "  \n", " ", " y"}));
  EXPECT_EQ(Pieces(*p, "end   "), (V{"end", "   "}));
}

TEST(KimiPattern, WhitespaceIsUnicodeWhiteSpaceNotPcre2Default) {
  auto p = Kimi();
  // U+180E is White_Space for PCRE2's \s but not for Rust's: it must act as punctuation here.
  EXPECT_EQ(Pieces(*p,
                   "\xe1\xa0\x8e"
                   "!"),
            (V{"\xe1\xa0\x8e"
               "!"}));
  // U+3000 and U+00A0 are White_Space in both.
  const std::string ideo = "\xe3\x80\x80";
  EXPECT_EQ(Pieces(*p, "a" + ideo + ideo + "b"), (V{"a", ideo, ideo + "b"}));
}

TEST(Pretokenizer, InvalidUtf8IsKeptAsGapPieces) {
  auto p = Kimi();
  const std::string text =
      "ab\xff\xfe"
      "cd\xe4\xb8";
  std::string joined;
  for (const std::string& piece : Pieces(*p, text)) joined += piece;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(Pieces(*p, text), (V{"ab", "\xff\xfe", "cd", "\xe4\xb8"}));
}

TEST(Pretokenizer, TranslatorRejectsWhatItCannotTranslate) {
  EXPECT_FALSE(TranslatePattern(R"(\w+)").ok());
  EXPECT_FALSE(TranslatePattern(R"(\bfoo)").ok());
  EXPECT_FALSE(TranslatePattern(R"([a--b])").ok());
  EXPECT_FALSE(TranslatePattern(R"([[:alpha:]])").ok());
  EXPECT_FALSE(TranslatePattern(R"([^\p{L}&&[^\p{Han}]])").ok());
  EXPECT_FALSE(Pretokenizer::Create("(unclosed").ok());
}

// Both rewrites of each intersection class, and the definition itself (X and not Script=Han,
// evaluated by two separate PCRE2 classes), agree on every Unicode scalar value.
TEST(KimiPattern, IntersectionRewritesAgreeOnEveryCodePoint) {
  struct Case {
    const char* rust_class;
    const char* members;
  };
  const Case cases[] = {
      {R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]])", R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])"},
      {R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]])", R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])"},
  };
  auto han = Pretokenizer::Create(R"(\p{sc:Han})");
  ASSERT_TRUE(han.ok());
  for (const Case& c : cases) {
    auto complement = Pretokenizer::Create(*TranslatePattern(c.rust_class));
    auto lookahead = Pretokenizer::Create(*TranslatePatternWithLookaheads(c.rust_class));
    auto members = Pretokenizer::Create(c.members);
    ASSERT_TRUE(complement.ok() && lookahead.ok() && members.ok());
    int in_class = 0;
    for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      std::string s;
      if (cp < 0x80) {
        s = {static_cast<char>(cp)};
      } else if (cp < 0x800) {
        s = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      } else if (cp < 0x10000) {
        s = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
             static_cast<char>(0x80 | (cp & 0x3F))};
      } else {
        s = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
             static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
      const bool want = (*members)->FullMatch(s) && !(*han)->FullMatch(s);
      ASSERT_EQ((*complement)->FullMatch(s), want) << c.rust_class << " U+" << std::hex << cp;
      ASSERT_EQ((*lookahead)->FullMatch(s), want) << c.rust_class << " U+" << std::hex << cp;
      in_class += want;
    }
    EXPECT_GT(in_class, 10000);  // the class is not trivially empty
  }
}

}  // namespace
}  // namespace kimi::tokenizer
