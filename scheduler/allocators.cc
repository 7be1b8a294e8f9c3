#include "scheduler/allocators.h"

#include <cassert>

namespace kimi::sched {

SlotAllocator::SlotAllocator(int64_t capacity) : capacity_(capacity), in_use_(capacity, 0) {
  for (int64_t s = capacity - 1; s >= 0; --s) free_.push_back(s);
}

std::optional<int64_t> SlotAllocator::Acquire() {
  if (free_.empty()) return std::nullopt;
  const int64_t s = free_.back();
  free_.pop_back();
  in_use_[s] = 1;
  return s;
}

void SlotAllocator::Release(int64_t slot) {
  assert(slot >= 0 && slot < capacity_ && in_use_[slot] && "slot released twice");
  in_use_[slot] = 0;
  free_.push_back(slot);
}

PageAllocator::PageAllocator(int64_t capacity) : refs_(capacity, 0) {
  for (int64_t p = capacity - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

std::optional<int32_t> PageAllocator::Acquire() {
  if (free_.empty()) return std::nullopt;
  const int32_t p = free_.back();
  free_.pop_back();
  refs_[p] = 1;
  return p;
}

void PageAllocator::Ref(int32_t page) {
  assert(refs_[page] > 0 && "ref of a free page");
  ++refs_[page];
}

void PageAllocator::Unref(int32_t page) {
  assert(refs_[page] > 0 && "page released twice");
  if (--refs_[page] == 0) free_.push_back(page);
}

}  // namespace kimi::sched
