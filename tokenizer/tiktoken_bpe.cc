#include "tokenizer/tiktoken_bpe.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kimi::tokenizer {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Pieces up to this many bytes use tiktoken's own quadratic loop; longer ones the heap loop.
constexpr size_t kQuadraticMaxBytes = 128;

}  // namespace

absl::StatusOr<BpeRanks> BpeRanks::Parse(absl::string_view text) {
  BpeRanks r;
  // One rank per line, with room for gaps: a rank far past the line count is refused before the
  // table is sized by it (one line of rank 2^30 - 1 asked for 32 GiB).
  constexpr int64_t kMaxGap = 1 << 16;
  const int64_t lines = static_cast<int64_t>(std::count(text.begin(), text.end(), '\n')) + 1;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    int32_t rank = -1;
    std::string bytes;
    if (space == absl::string_view::npos || !absl::SimpleAtoi(line.substr(space + 1), &rank) ||
        rank < 0 || !absl::Base64Unescape(line.substr(0, space), &bytes) || bytes.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tiktoken ranks: line ", line_no, " is not \"<base64 bytes> <rank>\""));
    }
    if (rank >= lines + kMaxGap) {
      return absl::InvalidArgumentError(absl::StrCat("tiktoken ranks: line ", line_no, ": rank ",
                                                     rank, " is far past the file's ", lines,
                                                     " lines (one rank per line)"));
    }
    if (static_cast<size_t>(rank) >= r.bytes_of_.size()) r.bytes_of_.resize(rank + 1);
    if (!r.bytes_of_[rank].empty() || !r.rank_of_.emplace(bytes, rank).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tiktoken ranks: line ", line_no, ": duplicate rank or token (rank ", rank, ")"));
    }
    r.bytes_of_[rank] = std::move(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = r.rank_of_.find(absl::string_view(reinterpret_cast<const char*>(&b), 1));
    if (it == r.rank_of_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tiktoken ranks: byte ", b, " has no token; byte-level BPE needs all 256 single bytes"));
    }
    r.byte_rank_[b] = it->second;
  }
  return r;
}

std::optional<int32_t> BpeRanks::Rank(absl::string_view bytes) const {
  auto it = rank_of_.find(bytes);
  if (it == rank_of_.end()) return std::nullopt;
  return it->second;
}

absl::string_view BpeRanks::Bytes(int32_t rank) const {
  if (rank < 0 || rank >= end_rank()) return {};
  return bytes_of_[rank];
}

void BpeRanks::EncodePiece(absl::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out->push_back(byte_rank_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (auto it = rank_of_.find(piece); it != rank_of_.end()) {
    out->push_back(it->second);
    return;
  }
  if (piece.size() <= kQuadraticMaxBytes) {
    MergeQuadratic(piece, out);
  } else {
    MergeHeap(piece, out);
  }
}

// A transcription of tiktoken's `_byte_pair_merge`: parts[i] = (start byte, rank of the pair that
// starts at part i); merge the lowest (leftmost on ties), refresh the two neighbouring pair ranks.
void BpeRanks::MergeQuadratic(absl::string_view piece, std::vector<int32_t>* out) const {
  const size_t n = piece.size();
  if (n == 0) return;
  auto rank_of = [&](size_t begin, size_t end) -> uint32_t {
    auto it = rank_of_.find(piece.substr(begin, end - begin));
    return it == rank_of_.end() ? kNoRank : static_cast<uint32_t>(it->second);
  };
  std::vector<std::pair<size_t, uint32_t>> parts;
  parts.reserve(n + 1);
  std::pair<uint32_t, size_t> min_rank = {kNoRank, 0};
  for (size_t i = 0; i + 1 < n; ++i) {
    const uint32_t r = rank_of(i, i + 2);
    if (r < min_rank.first) min_rank = {r, i};
    parts.emplace_back(i, r);
  }
  parts.emplace_back(n - 1, kNoRank);
  parts.emplace_back(n, kNoRank);
  auto pair_rank = [&](size_t i) -> uint32_t {
    return i + 3 < parts.size() ? rank_of(parts[i].first, parts[i + 3].first) : kNoRank;
  };
  while (min_rank.first != kNoRank) {
    const size_t i = min_rank.second;
    if (i > 0) parts[i - 1].second = pair_rank(i - 1);
    parts[i].second = pair_rank(i);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    min_rank = {kNoRank, 0};
    for (size_t j = 0; j + 1 < parts.size(); ++j) {
      if (parts[j].second < min_rank.first) min_rank = {parts[j].second, j};
    }
  }
  for (size_t j = 0; j + 1 < parts.size(); ++j) {
    const size_t b = parts[j].first, e = parts[j + 1].first;
    out->push_back(e - b == 1 ? byte_rank_[static_cast<uint8_t>(piece[b])]
                              : static_cast<int32_t>(rank_of(b, e)));
  }
}

// The same merge order with a min-heap of (rank, left start). Parts are a linked list over their
// start bytes; a heap entry is stale when its left part died or its right neighbour changed (its
// recorded end no longer matches). The heap's least valid entry is the lowest rank, leftmost on
// ties, which is the pair tiktoken's linear scan picks, so both loops merge in the same order.
void BpeRanks::MergeHeap(absl::string_view piece, std::vector<int32_t>* out) const {
  const size_t n = piece.size();
  if (n == 0) return;
  auto rank_of = [&](size_t begin, size_t end) -> uint32_t {
    auto it = rank_of_.find(piece.substr(begin, end - begin));
    return it == rank_of_.end() ? kNoRank : static_cast<uint32_t>(it->second);
  };
  std::vector<size_t> next(n), prev(n);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? n : i - 1;  // n = none
  }
  struct Entry {
    uint32_t rank;
    size_t start, end;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : start > o.start;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push_pair = [&](size_t left) {
    if (left >= n || next[left] >= n) return;
    const size_t end = next[next[left]];
    const uint32_t r = rank_of(left, end);
    if (r != kNoRank) heap.push({r, left, end});
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Entry e = heap.top();
    heap.pop();
    if (!alive[e.start] || next[e.start] >= n || next[next[e.start]] != e.end) continue;
    const size_t right = next[e.start];
    alive[right] = 0;
    next[e.start] = next[right];
    if (next[right] < n) prev[next[right]] = e.start;
    push_pair(e.start);
    if (prev[e.start] < n) push_pair(prev[e.start]);
  }
  for (size_t i = 0; i < n; i = next[i]) {
    out->push_back(next[i] - i == 1 ? byte_rank_[static_cast<uint8_t>(piece[i])]
                                    : static_cast<int32_t>(rank_of(i, next[i])));
  }
}

}  // namespace kimi::tokenizer
