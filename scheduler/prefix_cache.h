// Prefix cache for the hybrid state. A KDA layer's state cannot be cut at an arbitrary position
// the way a KV cache can, so the cache keeps snapshots of the whole per-request KDA state (all
// layers, recurrent + conv) at fixed token boundaries, each with refs on the MLA pages that hold
// the same prefix. A new request resumes from the deepest snapshot its prompt matches, never
// mid-block. Entries are keyed by a hash chain over the token blocks, verified token by token on
// a hit, and evicted least-recently-used.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "scheduler/allocators.h"

namespace kimi::sched {

class PrefixCache {
 public:
  // interval: tokens between snapshots (a multiple of page_size). max_bytes: snapshot memory,
  // snapshot_bytes the size of one. Snapshots are host copies named by handles; `drop` frees one
  // (the cache owns the handles it was given).
  PrefixCache(int64_t interval, int64_t page_size, int64_t max_bytes, int64_t snapshot_bytes,
              PageAllocator* pages, std::function<void(int64_t handle)> drop);
  ~PrefixCache();

  struct Hit {
    int64_t tokens = 0;  // prefix length restored
    int64_t handle = -1;  // the KDA snapshot
    std::span<const int32_t> pages;  // pages covering [0, tokens)
  };
  // Deepest snapshot whose tokens equal tokens[0, n) with n <= limit. Counts a query (and a hit)
  // unless `count` is false; the caller then counts with Count once the request is admitted for
  // good (one that does not fit is looked up again at every step until it does).
  Hit Lookup(std::span<const int32_t> tokens, int64_t limit, bool count = true);
  void Count(int64_t hit_tokens);
  // Whether a snapshot of these tokens would be kept (a multiple of the interval, not cached yet,
  // fits the budget): ask before taking one.
  bool Wants(std::span<const int32_t> tokens) const;
  // Records the snapshot `handle` of the state after exactly tokens.size() tokens; the cache owns
  // the handle from now on.
  void Insert(std::span<const int32_t> tokens, int64_t handle, std::span<const int32_t> pages);
  bool Contains(std::span<const int32_t> tokens) const;
  // Drops least-recently-used entries until `pages_needed` pages are free; returns whether enough
  // are. Drops nothing when even every entry would not free enough (pages running requests share
  // stay): the cache was wiped by every reservation that failed anyway.
  bool FreePages(int64_t pages_needed);
  // Pages only the cache holds: what dropping every entry would free.
  int64_t FreeablePages() const;

  int64_t interval() const { return interval_; }
  // Snapshots the memory holds at once.
  int64_t capacity() const { return snapshot_bytes_ > 0 ? max_bytes_ / snapshot_bytes_ : 0; }
  int64_t entries() const { return static_cast<int64_t>(lru_.size()); }
  int64_t bytes() const { return bytes_; }
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }
  int64_t saved_tokens() const { return saved_tokens_; }
  // Adds one count per page ref the cache holds (for invariant checks).
  void CountPageRefs(std::vector<int32_t>& counts) const {
    for (const Entry& e : lru_) {
      for (int32_t p : e.pages) ++counts[p];
    }
  }

 private:
  struct Entry {
    uint64_t key;
    std::vector<int32_t> tokens;
    int64_t handle;
    std::vector<int32_t> pages;
  };
  static uint64_t ChainKey(uint64_t prev, std::span<const int32_t> block);
  void EvictOldest();

  uint64_t KeyOf(std::span<const int32_t> tokens) const;

  int64_t interval_, page_size_, max_bytes_, snapshot_bytes_;
  PageAllocator* pages_;
  std::function<void(int64_t)> drop_;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
  int64_t bytes_ = 0, queries_ = 0, hits_ = 0, saved_tokens_ = 0;
};

}  // namespace kimi::sched
