#include "scheduler/prefix_cache.h"

#include <algorithm>

namespace kimi::sched {

PrefixCache::PrefixCache(int64_t interval, int64_t page_size, int64_t max_bytes,
                         int64_t snapshot_bytes, PageAllocator* pages,
                         std::function<void(int64_t)> drop)
    : interval_(interval),
      page_size_(page_size),
      max_bytes_(max_bytes),
      snapshot_bytes_(snapshot_bytes),
      pages_(pages),
      drop_(std::move(drop)) {}

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

PrefixCache::Hit PrefixCache::Lookup(std::span<const int32_t> tokens, int64_t limit, bool count) {
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
    best = Hit{end, e.handle, e.pages};
    lru_.splice(lru_.begin(), lru_, it->second);
  }
  if (count) Count(best.tokens);
  return best;
}

void PrefixCache::Count(int64_t hit_tokens) {
  ++queries_;
  if (hit_tokens > 0) {
    ++hits_;
    saved_tokens_ += hit_tokens;
  }
}

uint64_t PrefixCache::KeyOf(std::span<const int32_t> tokens) const {
  uint64_t key = 0;
  for (size_t end = interval_; end <= tokens.size(); end += interval_) {
    key = ChainKey(key, tokens.subspan(end - interval_, interval_));
  }
  return key;
}

bool PrefixCache::Contains(std::span<const int32_t> tokens) const {
  return index_.count(KeyOf(tokens)) > 0;
}

bool PrefixCache::Wants(std::span<const int32_t> tokens) const {
  return !tokens.empty() && tokens.size() % interval_ == 0 && snapshot_bytes_ <= max_bytes_ &&
         !Contains(tokens);
}

void PrefixCache::Insert(std::span<const int32_t> tokens, int64_t handle,
                         std::span<const int32_t> pages) {
  if (!Wants(tokens)) {
    drop_(handle);
    return;
  }
  const uint64_t key = KeyOf(tokens);
  while (bytes_ + snapshot_bytes_ > max_bytes_ && !lru_.empty()) EvictOldest();
  Entry e{key, std::vector<int32_t>(tokens.begin(), tokens.end()), handle, {}};
  const int64_t n_pages = static_cast<int64_t>(tokens.size()) / page_size_;
  for (int64_t i = 0; i < n_pages; ++i) {
    pages_->Ref(pages[i]);
    e.pages.push_back(pages[i]);
  }
  bytes_ += snapshot_bytes_;
  lru_.push_front(std::move(e));
  index_[key] = lru_.begin();
}

void PrefixCache::EvictOldest() {
  Entry& e = lru_.back();
  for (int32_t p : e.pages) pages_->Unref(p);
  drop_(e.handle);
  bytes_ -= snapshot_bytes_;
  index_.erase(e.key);
  lru_.pop_back();
}

int64_t PrefixCache::FreeablePages() const {
  if (lru_.empty()) return 0;
  std::vector<int32_t> refs(static_cast<size_t>(pages_->capacity()), 0);
  CountPageRefs(refs);
  int64_t freeable = 0;
  for (size_t p = 0; p < refs.size(); ++p) {
    if (refs[p] > 0 && refs[p] == pages_->refs(static_cast<int32_t>(p))) ++freeable;
  }
  return freeable;
}

bool PrefixCache::FreePages(int64_t pages_needed) {
  if (pages_->free() >= pages_needed) return true;
  if (pages_->free() + FreeablePages() < pages_needed) return false;
  while (pages_->free() < pages_needed && !lru_.empty()) EvictOldest();
  return pages_->free() >= pages_needed;
}

}  // namespace kimi::sched
