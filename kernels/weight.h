// A weight matrix as the checkpoint stores it, viewed in place (usually inside a memory map).
#pragma once

#include <cassert>
#include <cstdint>

#include "kernels/dtype.h"

namespace kimi {

enum class WeightFormat : uint8_t {
  kF32,
  kF16,
  kBF16,
  // OCP MXFP4 as compressed-tensors writes it: `data` is [rows, cols/2] bytes holding two E2M1
  // codes each (low nibble = even column), `scales` is [rows, cols/32] E8M0 bytes (2^(s-127)).
  kMxfp4,
};

// Rows per group of the packed layouts (kernels/cpu/pack.h), but kTiles's.
constexpr int64_t kPackRows = 8;
// Rows per group of kTiles: one AMX tile holds 16 rows' pairs of a 32-column block.
constexpr int64_t kTileRows = 16;

// How a packed weight orders the bytes of each group (kernels/cpu/pack.h): by 32-column block, by
// canonical lane, (MXFP4 only) by row pair sharing each code byte, or (16-row groups) as AMX tiles
// of the transposed block.
enum class PackLayout : uint8_t { kBlocks, kLanes, kPairs, kTiles };

// Rows per group of `layout`.
constexpr int64_t PackGroupRows(PackLayout layout) {
  return layout == PackLayout::kTiles ? kTileRows : kPackRows;
}

// [rows, cols] row-major, PyTorch's [out_features, in_features] -- or, when `packed`, the same
// bytes reordered within each group of PackGroupRows(layout) rows as `layout` says
// (kernels/cpu/pack.h); a group occupies exactly the bytes its rows would, so views of whole groups
// keep their addresses.
struct Weight {
  const void* data = nullptr;
  const uint8_t* scales = nullptr;  // kMxfp4 only
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool packed = false;  // bf16 or MXFP4, rows % PackGroupRows(layout) == 0, cols % 32 == 0
  PackLayout layout = PackLayout::kBlocks;  // meaningful with `packed`

  // Bytes of `data`: the elements, or for MXFP4 the codes (two per byte).
  int64_t DataBytes() const {
    switch (format) {
      case WeightFormat::kF32:
        return rows * cols * 4;
      case WeightFormat::kF16:
      case WeightFormat::kBF16:
        return rows * cols * 2;
      case WeightFormat::kMxfp4:
        return rows * (cols / 2);
    }
    return 0;
  }
  // Bytes of `scales` (MXFP4 only; else 0).
  int64_t ScaleBytes() const { return format == WeightFormat::kMxfp4 ? rows * (cols / 32) : 0; }
  // Bytes read by one pass over the matrix (packed size for MXFP4).
  int64_t Bytes() const { return DataBytes() + ScaleBytes(); }
  // Row r as a matrix of one row.
  Weight Row(int64_t r) const;
  // Rows [begin, begin + count); for a packed weight `begin` must be a multiple of its group.
  Weight Rows(int64_t begin, int64_t count) const;
};

inline Weight Weight::Rows(int64_t begin, int64_t count) const {
  assert(!packed || begin % PackGroupRows(layout) == 0);
  Weight w = *this;
  w.rows = count;
  const auto* base = static_cast<const uint8_t*>(data);
  switch (format) {
    case WeightFormat::kF32:
      w.data = base + begin * cols * 4;
      break;
    case WeightFormat::kF16:
    case WeightFormat::kBF16:
      w.data = base + begin * cols * 2;
      break;
    case WeightFormat::kMxfp4:
      w.data = base + begin * (cols / 2);
      w.scales = scales + begin * (cols / 32);
      break;
  }
  return w;
}

inline Weight Weight::Row(int64_t r) const { return Rows(r, 1); }

}  // namespace kimi
