// Fixed pools of state: KDA slots (one per running request) and MLA KV pages (refcounted, so the
// prefix cache and the requests that restored from it can share a prefix's pages).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kimi::sched {

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t capacity);
  std::optional<int64_t> Acquire();
  void Release(int64_t slot);
  int64_t capacity() const { return capacity_; }
  int64_t used() const { return capacity_ - static_cast<int64_t>(free_.size()); }
  int64_t free() const { return static_cast<int64_t>(free_.size()); }

 private:
  int64_t capacity_;
  std::vector<int64_t> free_;  // a stack: the most recently released slot is reused first
  std::vector<char> in_use_;
};

class PageAllocator {
 public:
  explicit PageAllocator(int64_t capacity);
  std::optional<int32_t> Acquire();  // refcount 1
  void Ref(int32_t page);
  void Unref(int32_t page);          // returns the page to the pool at refcount 0
  int32_t refs(int32_t page) const { return refs_[page]; }
  int64_t capacity() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free() const { return static_cast<int64_t>(free_.size()); }
  int64_t used() const { return capacity() - free(); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;
};

}  // namespace kimi::sched
