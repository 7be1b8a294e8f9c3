#include "kernels/cpu/pack.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace kimi::cpu {
namespace {

// How a layout moves a row's data: `unit` bytes at a time, `block_units` units per 32 columns.
// kBlocks moves a row's whole block (64 bytes of bf16, 16 of MXFP4 codes); kLanes and kTiles one
// lane's pair (4 bytes of bf16, 1 byte of codes).
struct Units {
  int64_t unit, block_units;
};
Units DataUnits(const Weight& w, PackLayout layout) {
  const int64_t pair = w.format == WeightFormat::kBF16 ? 4 : 1;
  return layout == PackLayout::kBlocks ? Units{16 * pair, 1} : Units{pair, 16};
}
constexpr Units kScaleUnits{1, 1};  // one scale byte per block, in block order in every layout
// Where the scales go: a group's rows block after block, in the layout's groups (16 rows for
// kTiles, 8 for the others, whose scales all lie as kBlocks's).
PackLayout ScaleLayout(PackLayout layout) {
  return layout == PackLayout::kTiles ? PackLayout::kTiles : PackLayout::kBlocks;
}

// Where unit u of row j of a group goes, for `per_row` units per row.
int64_t PackedUnit(PackLayout layout, int64_t j, int64_t u, int64_t per_row, int64_t block_units) {
  const int64_t G = PackGroupRows(layout);
  const int64_t nb = per_row / block_units, b = u / block_units, i = u % block_units;
  if (layout == PackLayout::kBlocks) return (b * G + j) * block_units + i;
  if (layout == PackLayout::kTiles) return (b * block_units + i) * G + j;  // i is the lane J
  return (i * nb + b) * G + j;
}

// Reorders every group of G rows of `rows` rows, `per_row` units of kUnit bytes each, between the
// row-major order and `layout`: packing when `pack`, else the inverse.
template <int64_t kUnit>
void ReorderUnits(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t per_row,
                  int64_t block_units, PackLayout layout, bool pack) {
  const int64_t G = PackGroupRows(layout);
  const int64_t group_bytes = G * per_row * kUnit;
  for (int64_t g = 0; g < rows / G; ++g) {
    const uint8_t* in = src + g * group_bytes;
    uint8_t* out = dst + g * group_bytes;
    for (int64_t j = 0; j < G; ++j) {
      for (int64_t u = 0; u < per_row; ++u) {
        const int64_t row_major = j * per_row + u;
        const int64_t packed = PackedUnit(layout, j, u, per_row, block_units);
        std::memcpy(out + (pack ? packed : row_major) * kUnit,
                    in + (pack ? row_major : packed) * kUnit, kUnit);
      }
    }
  }
}

// `bytes` bytes per row (a multiple of units.unit).
void Reorder(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t bytes, Units units,
             PackLayout layout, bool pack) {
  const int64_t per_row = bytes / units.unit, bu = units.block_units;
  switch (units.unit) {
    case 1:
      return ReorderUnits<1>(src, dst, rows, per_row, bu, layout, pack);
    case 4:
      return ReorderUnits<4>(src, dst, rows, per_row, bu, layout, pack);
    case 16:
      return ReorderUnits<16>(src, dst, rows, per_row, bu, layout, pack);
    default:
      return ReorderUnits<64>(src, dst, rows, per_row, bu, layout, pack);
  }
}

// MXFP4 codes of a nibble-moving layout (kPairs, kTiles): moves every nibble of `rows` rows of
// `cols` columns, in groups of G, between the row-major order and where(j, c), the byte and shift
// of column c of row j of a group; packing when `pack`, else the inverse.
template <int64_t G, class Where>
void ReorderNibbles(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols, bool pack,
                    const Where& where) {
  const int64_t group_bytes = G * cols / 2;
  std::memset(dst, 0, rows / G * group_bytes);
  for (int64_t g = 0; g < rows / G; ++g) {
    const uint8_t* in = src + g * group_bytes;
    uint8_t* out = dst + g * group_bytes;
    for (int64_t j = 0; j < G; ++j) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t row_major = j * cols / 2 + c / 2, row_major_shift = 4 * (c % 2);
        const CodeNibble packed = where(j, c);
        const int64_t from = pack ? row_major : packed.byte, to = pack ? packed.byte : row_major;
        const int64_t from_shift = pack ? row_major_shift : packed.shift;
        const int64_t to_shift = pack ? packed.shift : row_major_shift;
        out[to] = static_cast<uint8_t>(out[to] | ((in[from] >> from_shift) & 0xf) << to_shift);
      }
    }
  }
}

// body(in, out) for each 16-row group of `rows` rows of `cols` MXFP4 codes, in src and dst.
template <class Body>
void ForEachTileGroup(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols,
                      const Body& body) {
  const int64_t group_bytes = kTileRows * cols / 2;
  for (int64_t g = 0; g < rows / kTileRows; ++g) body(src + g * group_bytes, dst + g * group_bytes);
}

// kTiles MXFP4 codes packed a byte at a time (TilesCodeNibble's layout: the loader packs every
// expert, and a 2048 x 7168 weight took 9 ms to pack this way, 31 nibble by nibble): byte h of word
// w of chunk q of block b holds, low then high, the codes of lanes 4q + 2h and 4q + 2h + 1 of row w
// / 2 of the group, element w % 2 of each lane, which are nibble w % 2 of that row's code bytes 4q
// + 2h and 4q + 2h + 1 of the block.
void PackTileCodes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  const int64_t nb = cols / 32, row_bytes = cols / 2;
  ForEachTileGroup(src, dst, rows, cols, [&](const uint8_t* in, uint8_t* out) {
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t q = 0; q < 4; ++q) {
        for (int64_t w = 0; w < 32; ++w) {
          const uint8_t* lanes = in + (w / 2) * row_bytes + b * 16 + 4 * q;
          const int shift = 4 * static_cast<int>(w % 2);
          for (int64_t h = 0; h < 2; ++h) {
            const int lo = (lanes[2 * h] >> shift) & 0xf, hi = (lanes[2 * h + 1] >> shift) & 0xf;
            out[b * 256 + q * 64 + w * 2 + h] = static_cast<uint8_t>(lo | hi << 4);
          }
        }
      }
    }
  });
}

// PackTileCodes undone (what CopyRowMajor hands the CUDA loader), a byte at a time in the order it
// writes, as PackTileCodes goes in its own (one loop over TilesCodeNibble for both directions took
// 12.5 / 13.4 ms for the same weight against these two's 9 / 4.7, and 31 nibble by nibble): code
// byte J of
// block b of row j holds elements 2J and 2J + 1, lane J's pair, which lie in words 2j and 2j + 1 of
// chunk J / 4, nibble J % 4 of each.
void UnpackTileCodes(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  const int64_t nb = cols / 32, row_bytes = cols / 2;
  ForEachTileGroup(src, dst, rows, cols, [&](const uint8_t* in, uint8_t* out) {
    for (int64_t j = 0; j < kTileRows; ++j) {
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t lane = 0; lane < 16; ++lane) {
          const uint8_t* word = in + b * 256 + (lane / 4) * 64 + 4 * j + (lane % 4) / 2;
          const int shift = 4 * static_cast<int>(lane % 2);
          const int lo = (word[0] >> shift) & 0xf, hi = (word[2] >> shift) & 0xf;
          out[j * row_bytes + b * 16 + lane] = static_cast<uint8_t>(lo | hi << 4);
        }
      }
    }
  });
}

// Reorders `rows` rows of w's data from src to dst for `layout`.
void ReorderData(const Weight& w, const uint8_t* src, uint8_t* dst, int64_t rows, PackLayout layout,
                 bool pack) {
  if (layout == PackLayout::kPairs) {
    return ReorderNibbles<kPackRows>(src, dst, rows, w.cols, pack, [](int64_t j, int64_t c) {
      return CodeNibble{PairsCodeByte(j, c / 32, c % 32), static_cast<int>(4 * (j % 2))};
    });
  }
  if (layout == PackLayout::kTiles && w.format == WeightFormat::kMxfp4) {
    return pack ? PackTileCodes(src, dst, rows, w.cols) : UnpackTileCodes(src, dst, rows, w.cols);
  }
  Reorder(src, dst, rows, w.DataBytes() / w.rows, DataUnits(w, layout), layout, pack);
}

}  // namespace

PackLayout PreferredPackLayout(WeightFormat format) {
  switch (MatMulIsa()) {
    case Isa::kAmx:
      return PackLayout::kTiles;
    case Isa::kAvx2:
      return format == WeightFormat::kMxfp4 ? PackLayout::kPairs : PackLayout::kLanes;
    default:
      return PackLayout::kBlocks;
  }
}

bool LayoutFits(PackLayout layout, WeightFormat format) {
  if (layout == PackLayout::kPairs) return format == WeightFormat::kMxfp4;
  return true;
}

bool CanPack(const Weight& w, PackLayout layout) {
  const bool shape = (w.format == WeightFormat::kBF16 || w.format == WeightFormat::kMxfp4) &&
                     !w.packed && w.rows > 0 && w.rows % PackGroupRows(layout) == 0 &&
                     w.cols % 32 == 0 && LayoutFits(layout, w.format);
  if (!shape || layout != PackLayout::kTiles || w.format != WeightFormat::kMxfp4) return shape;
  // Every scale of a block with a nonzero code in range (the tiles' decode leaves zeros alone: an
  // all-zero block may have any scale, as a quantiser may give it 0), and none NaN (255: the
  // block's zeros are NaN too, everywhere else).
  const auto* codes = static_cast<const uint8_t*>(w.data);
  for (int64_t block = 0; block < w.ScaleBytes(); ++block) {
    const int s = w.scales[block];
    if (s >= kTilesMinScale && s <= kTilesMaxScale) continue;
    if (s == 255) return false;
    for (int64_t i = 0; i < 16; ++i) {
      if ((codes[block * 16 + i] & 0x77) != 0) return false;  // a nonzero magnitude
    }
  }
  return true;
}

void PackInPlace(Weight* w, PackLayout layout) {
  if (!CanPack(*w, layout)) return;
  auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(w->data));
  const int64_t G = PackGroupRows(layout);
  const int64_t row_bytes = w->DataBytes() / w->rows;
  std::vector<uint8_t> group(G * row_bytes);
  for (int64_t g = 0; g < w->rows / G; ++g) {  // a group at a time: a small scratch copy
    uint8_t* base = data + g * G * row_bytes;
    std::memcpy(group.data(), base, group.size());
    ReorderData(*w, group.data(), base, G, layout, /*pack=*/true);
  }
  if (w->format == WeightFormat::kMxfp4) {
    auto* scales = const_cast<uint8_t*>(w->scales);
    const std::vector<uint8_t> copy(scales, scales + w->ScaleBytes());
    Reorder(copy.data(), scales, w->rows, w->cols / 32, kScaleUnits, ScaleLayout(layout),
            /*pack=*/true);
  }
  w->packed = true;
  w->layout = layout;
}

void CopyRowMajor(const Weight& w, uint8_t* data, uint8_t* scales) {
  const auto* src = static_cast<const uint8_t*>(w.data);
  if (!w.packed) {
    std::memcpy(data, src, w.DataBytes());
    if (w.format == WeightFormat::kMxfp4) std::memcpy(scales, w.scales, w.ScaleBytes());
    return;
  }
  ReorderData(w, src, data, w.rows, w.layout, /*pack=*/false);
  if (w.format == WeightFormat::kMxfp4) {
    Reorder(w.scales, scales, w.rows, w.cols / 32, kScaleUnits, ScaleLayout(w.layout),
            /*pack=*/false);
  }
}

}  // namespace kimi::cpu
