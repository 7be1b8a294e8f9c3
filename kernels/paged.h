// Paged row storage shared by the KV cache and the kernels that read it: a POD view, built once per
// step on the host and reused by every layer.
#pragma once

#include <cstdint>

namespace kimi {

// Logical row `pos` of one sequence lives in page pages[pos / page_size] at slot pos % page_size.
// pool: [num_pages, page_size, row_width].
struct PagedRows {
  float* pool = nullptr;
  const int32_t* pages = nullptr;
  int64_t page_size = 0;
  int64_t row_width = 0;

  float* Row(int64_t pos) const {
    return pool + (static_cast<int64_t>(pages[pos / page_size]) * page_size + pos % page_size) *
                      row_width;
  }
};

}  // namespace kimi
