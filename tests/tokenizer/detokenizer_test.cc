#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include "tests/tokenizer/test_util.h"

namespace kimi::tokenizer {
namespace {

// Byte-level vocabulary: token b is byte b, so any split of a character can be pushed.
std::unique_ptr<Tokenizer> Bytes() {
  auto tok =
      Tokenizer::FromParts(testing::ByteRanks(), R"(\p{L}+|\s+|.)", {{"<|im_end|>", 256, true}});
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

std::string PushAll(StreamingDetokenizer& d, absl::string_view bytes,
                    std::vector<std::string>* parts) {
  std::string out;
  for (char c : bytes) {
    auto o = d.Push(static_cast<uint8_t>(c));
    parts->push_back(o.text);
    out += o.text;
  }
  return out;
}

TEST(StreamingDetokenizer, HoldsPartialCharactersUntilComplete) {
  auto tok = Bytes();
  StreamingDetokenizer d(tok.get(), {});
  std::vector<std::string> parts;
  const std::string text = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80z";  // a é 中 😀 z
  EXPECT_EQ(PushAll(d, text, &parts), text);
  EXPECT_EQ(parts, (std::vector<std::string>{"a", "", "\xc3\xa9", "", "", "\xe4\xb8\xad", "", "",
                                             "", "\xf0\x9f\x98\x80", "z"}));
  EXPECT_EQ(d.Finish().text, "");
}

TEST(StreamingDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  auto tok = Bytes();
  StreamingDetokenizer d(tok.get(), {});
  std::vector<std::string> parts;
  // lone continuation, overlong C0, a truncated 3-byte sequence interrupted by 'x', surrogate ED A0
  const std::string out = PushAll(d,
                                  "\x80"
                                  "\xc0\xaf"
                                  "\xe4\xb8x"
                                  "\xed\xa0\x80",
                                  &parts);
  EXPECT_EQ(out + d.Finish().text,
            "\xEF\xBF\xBD"
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "\xEF\xBF\xBDx"
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  StreamingDetokenizer tail(tok.get(), {});
  EXPECT_EQ(tail.Push(0xe4).text, "");
  EXPECT_EQ(tail.Finish().text, "\xEF\xBF\xBD");  // a stream ending mid-character
}

TEST(StreamingDetokenizer, StopStringSpanningTokensIsNeverSent) {
  auto tok = Bytes();
  StreamingDetokenizer d(tok.get(), {{"STOP", "\n\n"}});
  std::vector<std::string> parts;
  std::string out;
  for (char c : std::string("Hello ST")) out += d.Push(static_cast<uint8_t>(c)).text;
  EXPECT_EQ(out, "Hello ");  // "ST" may begin STOP: held back
  auto o = d.Push('O');
  EXPECT_EQ(o.text, "");
  o = d.Push('P');
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
  EXPECT_EQ(d.matched_stop(), "STOP");
  EXPECT_EQ(d.Push('x').text, "");  // nothing after a stop
  EXPECT_EQ(d.Finish().text, "");
}

TEST(StreamingDetokenizer, HeldTextIsReleasedWhenItStopsMatching) {
  auto tok = Bytes();
  StreamingDetokenizer d(tok.get(), {{"abc"}});
  std::string out;
  for (char c : std::string("xabXaab")) out += d.Push(static_cast<uint8_t>(c)).text;
  EXPECT_EQ(out, "xabXa");  // "ab" could still start "abc"
  out += d.Finish().text;
  EXPECT_EQ(out, "xabXaab");
}

TEST(StreamingDetokenizer, StopInsideOneTokenAndEarliestWins) {
  auto tok = Tokenizer::FromParts(testing::ByteRanks({"ab", "abcd", "xyz"}), R"(\p{L}+|.)", {});
  ASSERT_TRUE(tok.ok());
  StreamingDetokenizer d(tok->get(), {{"cd", "b"}});
  auto o = d.Push(257);  // "abcd"
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "a");
  EXPECT_EQ(d.matched_stop(), "b");
}

TEST(StreamingDetokenizer, StopAfterMultibyteCharacterAndSpecialTokensSkipped) {
  auto tok = Bytes();
  StreamingDetokenizer d(tok.get(), {{"\xe4\xb8\xad!"}});
  std::string out;
  out += d.Push(256).text;  // <|im_end|> skipped
  for (char c : std::string("ok\xe4\xb8\xad?\xe4\xb8\xad!tail")) {
    auto o = d.Push(static_cast<uint8_t>(c));
    out += o.text;
    if (o.stopped) break;
  }
  EXPECT_EQ(out, "ok\xe4\xb8\xad?");
  StreamingDetokenizer keep(tok.get(), StreamingDetokenizer::Options{{}, false});
  EXPECT_EQ(keep.Push(256).text, "<|im_end|>");
}

// Added tokens marked `"special": false` (Kimi's tool-call markers) are text: skipping special
// tokens keeps them, so a client can parse tool calls out of the stream, and a stop string can
// match them.
TEST(StreamingDetokenizer, TokensNotMarkedSpecialAreKept) {
  auto tok = Tokenizer::FromParts(testing::ByteRanks(), R"(\p{L}+|\s+|.)",
                                  {{"<|im_end|>", 256, true}, {"<|tool_call_begin|>", 257, false}});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE((*tok)->IsSpecial(256));
  EXPECT_FALSE((*tok)->IsSpecial(257));
  EXPECT_FALSE((*tok)->IsSpecial('a'));
  StreamingDetokenizer d(tok->get(), {});
  std::string out = d.Push('a').text;
  out += d.Push(257).text;
  out += d.Push(256).text;
  EXPECT_EQ(out + d.Finish().text, "a<|tool_call_begin|>");
  StreamingDetokenizer stop(tok->get(), {{"<|tool"}});
  EXPECT_EQ(stop.Push('a').text, "a");
  const auto o = stop.Push(257);
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
}

}  // namespace
}  // namespace kimi::tokenizer
