#include "tokenizer/tiktoken_bpe.h"

#include <random>

#include <gtest/gtest.h>

#include "tests/tokenizer/test_util.h"

namespace kimi::tokenizer {
namespace {

using testing::ByteRanks;

TEST(BpeRanks, ParsesAndEncodesSingleBytes) {
  auto r = BpeRanks::Parse(ByteRanks());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->end_rank(), 256);
  std::vector<int32_t> ids;
  r->EncodePiece("ab\xff", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', 'b', 0xff}));
}

TEST(BpeRanks, LowestRankMergesFirstAndTiesGoLeft) {
  // "ab"=256 before "bc"=257: "abc" -> [ab, c]; "aaa" with "aa": leftmost pair merges.
  auto r = BpeRanks::Parse(ByteRanks({"ab", "bc", "aa", "abc"}));
  ASSERT_TRUE(r.ok());
  std::vector<int32_t> ids;
  r->EncodePiece("abcbc", &ids);  // ab + c b c -> abc(259) + bc(257)
  EXPECT_EQ(ids, (std::vector<int32_t>{259, 257}));
  ids.clear();
  r->EncodePiece("aaa", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{258, 'a'}));
  ids.clear();
  r->EncodePiece("abc", &ids);  // whole piece is a token
  EXPECT_EQ(ids, (std::vector<int32_t>{259}));
}

TEST(BpeRanks, RejectsBadFiles) {
  EXPECT_FALSE(BpeRanks::Parse("YQ== 0\n").ok());                          // bytes missing
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "YQ== 300\n").ok());          // duplicate bytes
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "YWI= 5\n").ok());            // duplicate rank
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "not-base64! 300\n").ok());   // bad base64
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "YWI=\n").ok());              // no rank
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "YWI= -3\n").ok());           // negative
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "YWI= 99999999999\n").ok());  // huge
  EXPECT_FALSE(BpeRanks::Parse(ByteRanks() + "YWI= 1073741823\n").ok());   // 32 GiB of table
  EXPECT_TRUE(BpeRanks::Parse(ByteRanks() + "\nYWI= 300\r\n").ok());       // gaps, CRLF, blanks
}

// The heap loop (long pieces) must merge exactly like tiktoken's quadratic loop.
TEST(BpeRanks, HeapLoopEqualsTiktokenLoopOnCl100k) {
  const std::string ranks_text = testing::Cl100kRanks();
  ASSERT_FALSE(ranks_text.empty());
  auto r = BpeRanks::Parse(ranks_text);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"a",    "b",   "e",  "th",           "ing",
                                          " ",    "the", "0",  "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                          "\xff", "=",   "==", "ab",           "ba"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string piece;
    const int n = 1 + static_cast<int>(rng() % 200);
    for (int k = 0; k < n; ++k) piece += parts[rng() % parts.size()];
    std::vector<int32_t> a, b;
    r->MergeQuadratic(piece, &a);
    r->MergeHeap(piece, &b);
    ASSERT_EQ(a, b) << "piece " << iter;
    std::string back;
    for (int32_t id : a) back += std::string(r->Bytes(id));
    ASSERT_EQ(back, piece);
  }
}

TEST(BpeRanks, KnownCl100kIds) {
  const std::string ranks_text = testing::Cl100kRanks();
  ASSERT_FALSE(ranks_text.empty());
  auto r = BpeRanks::Parse(ranks_text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->end_rank(), 100256);
  EXPECT_EQ(r->Rank("hello"), 15339);
  EXPECT_EQ(r->Rank(" world"), 1917);
  std::vector<int32_t> ids;
  r->EncodePiece("user", &ids);
  r->EncodePiece("assistant", &ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{882, 78191}));
}

}  // namespace
}  // namespace kimi::tokenizer
