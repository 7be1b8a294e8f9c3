#include "scheduler/prefix_cache.h"

#include <algorithm>

namespace kimi::sched {

PrefixCache::PrefixCache(int64_t interval, int64_t page_size, int64_t max_bytes,
                         int64_t snapshot_floats, PageAllocator* pages)
    : interval_(interval),
      page_size_(page_size),
      max_bytes_(max_bytes),
      snapshot_floats_(snapshot_floats),
      pages_(pages) {}

PrefixCache::~PrefixCache() {
  while (!lru_.empty()) EvictOldest();
}

uint64_t PrefixCache::ChainKey(uint64_t prev, std::span<const int32_t> block) {
  uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
  for (int32_t t : block) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull + (h << 6) +
         (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h ^ (h >> 33);
}

PrefixCache::Hit PrefixCache::Lookup(std::span<const int32_t> tokens, int64_t limit) {
  ++queries_;
  Hit best;
  uint64_t key = 0;
  const int64_t n = std::min<int64_t>(limit, static_cast<int64_t>(tokens.size()));
  for (int64_t end = interval_; end <= n; end += interval_) {
    key = ChainKey(key, tokens.subspan(end - interval_, interval_));
    auto it = index_.find(key);
    // A shallower entry may have been evicted while a deeper one survives: keep walking.
    if (it == index_.end()) continue;
    const Entry& e = *it->second;
    if (!std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin())) continue;  // collision
    best = Hit{end, &e.snapshot, e.pages};
    lru_.splice(lru_.begin(), lru_, it->second);
  }
  if (best.tokens > 0) {
    ++hits_;
    saved_tokens_ += best.tokens;
  }
  return best;
}

bool PrefixCache::Contains(std::span<const int32_t> tokens) const {
  uint64_t key = 0;
  for (size_t end = interval_; end <= tokens.size(); end += interval_) {
    key = ChainKey(key, tokens.subspan(end - interval_, interval_));
  }
  return index_.count(key) > 0;
}

void PrefixCache::Insert(std::span<const int32_t> tokens, std::span<const float> snapshot,
                         std::span<const int32_t> pages) {
  if (tokens.empty() || tokens.size() % interval_ != 0) return;
  const int64_t bytes = static_cast<int64_t>(snapshot.size() * sizeof(float));
  if (bytes > max_bytes_) return;
  uint64_t key = 0;
  for (size_t end = interval_; end <= tokens.size(); end += interval_) {
    key = ChainKey(key, tokens.subspan(end - interval_, interval_));
  }
  if (index_.count(key)) return;
  while (bytes_ + bytes > max_bytes_ && !lru_.empty()) EvictOldest();
  Entry e{key, std::vector<int32_t>(tokens.begin(), tokens.end()),
          std::vector<float>(snapshot.begin(), snapshot.end()), {}};
  const int64_t n_pages = static_cast<int64_t>(tokens.size()) / page_size_;
  for (int64_t i = 0; i < n_pages; ++i) {
    pages_->Ref(pages[i]);
    e.pages.push_back(pages[i]);
  }
  bytes_ += bytes;
  lru_.push_front(std::move(e));
  index_[key] = lru_.begin();
}

void PrefixCache::EvictOldest() {
  Entry& e = lru_.back();
  for (int32_t p : e.pages) pages_->Unref(p);
  bytes_ -= static_cast<int64_t>(e.snapshot.size() * sizeof(float));
  index_.erase(e.key);
  lru_.pop_back();
}

bool PrefixCache::FreePages(int64_t pages_needed) {
  while (pages_->free() < pages_needed && !lru_.empty()) EvictOldest();
  return pages_->free() >= pages_needed;
}

}  // namespace kimi::sched
