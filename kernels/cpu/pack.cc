#include "kernels/cpu/pack.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace kimi::cpu {
namespace {

constexpr int64_t G = kPackRows;

// Where unit u (0 <= u < per_row) of row j of a group goes, for `units_per_row` units per row.
// kBlocks moves `block_units` units at a time (a block's worth of one row); kLanes one unit (a
// lane's pair: 4 bytes of bf16, 1 byte of MXFP4 codes) at a time.
int64_t PackedUnit(PackLayout layout, int64_t j, int64_t u, int64_t per_row, int64_t block_units) {
  const int64_t nb = per_row / block_units, b = u / block_units, i = u % block_units;
  if (layout == PackLayout::kBlocks) return (b * G + j) * block_units + i;
  return (i * nb + b) * G + j;  // i is the lane J
}

// Reorders every group of G rows of `rows` rows, `per_row` units of kUnit bytes each, between the
// row-major order and `layout`: packing when `pack`, else the inverse.
template <int64_t kUnit>
void ReorderUnits(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t per_row,
                  int64_t block_units, PackLayout layout, bool pack) {
  constexpr int64_t unit = kUnit;
  const int64_t group_bytes = G * per_row * unit;
  for (int64_t g = 0; g < rows / G; ++g) {
    const uint8_t* in = src + g * group_bytes;
    uint8_t* out = dst + g * group_bytes;
    for (int64_t j = 0; j < G; ++j) {
      for (int64_t u = 0; u < per_row; ++u) {
        const int64_t row_major = j * per_row + u;
        const int64_t packed = PackedUnit(layout, j, u, per_row, block_units);
        std::memcpy(out + (pack ? packed : row_major) * unit,
                    in + (pack ? row_major : packed) * unit, unit);
      }
    }
  }
}

void Reorder(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t per_row, int64_t unit,
             int64_t block_units, PackLayout layout, bool pack) {
  if (unit == 4) {
    ReorderUnits<4>(src, dst, rows, per_row, block_units, layout, pack);
  } else {
    ReorderUnits<1>(src, dst, rows, per_row, block_units, layout, pack);
  }
}

// Data units of a row: bf16 pairs (4 bytes, 16 per block) or MXFP4 code bytes (16 per block).
int64_t UnitBytes(const Weight& w) { return w.format == WeightFormat::kBF16 ? 4 : 1; }
}  // namespace

PackLayout PreferredPackLayout(WeightFormat format) {
  return format == WeightFormat::kBF16 && MatMulIsa() != Isa::kAvx512 ? PackLayout::kLanes
                                                                      : PackLayout::kBlocks;
}

bool CanPack(const Weight& w) {
  return (w.format == WeightFormat::kBF16 || w.format == WeightFormat::kMxfp4) && !w.packed &&
         w.rows > 0 && w.rows % kPackRows == 0 && w.cols % 32 == 0;
}

void PackInPlace(Weight* w, PackLayout layout) {
  if (!CanPack(*w)) return;
  auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(w->data));
  const int64_t unit = UnitBytes(*w), per_row = w->DataBytes() / w->rows / unit;
  std::vector<uint8_t> group(G * per_row * unit);
  for (int64_t g = 0; g < w->rows / G; ++g) {  // a group at a time: a small scratch copy
    uint8_t* base = data + g * G * per_row * unit;
    std::memcpy(group.data(), base, group.size());
    Reorder(group.data(), base, G, per_row, unit, 16, layout, /*pack=*/true);
  }
  if (w->format == WeightFormat::kMxfp4) {
    auto* scales = const_cast<uint8_t*>(w->scales);
    const int64_t nb = w->cols / 32;
    std::vector<uint8_t> copy(scales, scales + w->rows * nb);
    Reorder(copy.data(), scales, w->rows, nb, 1, 1, PackLayout::kBlocks, /*pack=*/true);
  }
  w->packed = true;
  w->lane_major = layout == PackLayout::kLanes;
}

void CopyRowMajor(const Weight& w, uint8_t* data, uint8_t* scales) {
  const auto* src = static_cast<const uint8_t*>(w.data);
  const int64_t nb = w.cols / 32;
  if (!w.packed) {
    std::memcpy(data, src, w.DataBytes());
    if (w.format == WeightFormat::kMxfp4) std::memcpy(scales, w.scales, w.rows * nb);
    return;
  }
  const int64_t unit = UnitBytes(w), per_row = w.DataBytes() / w.rows / unit;
  const PackLayout layout = w.lane_major ? PackLayout::kLanes : PackLayout::kBlocks;
  Reorder(src, data, w.rows, per_row, unit, 16, layout, /*pack=*/false);
  if (w.format == WeightFormat::kMxfp4) {
    Reorder(w.scales, scales, w.rows, nb, 1, 1, PackLayout::kBlocks, /*pack=*/false);
  }
}

}  // namespace kimi::cpu
