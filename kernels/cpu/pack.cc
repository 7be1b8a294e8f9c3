#include "kernels/cpu/pack.h"

#include <cstring>
#include <vector>

namespace kimi::cpu {
namespace {

// dst[g][b][j] = src[g*G + j][b] for units of `unit` bytes, `blocks` units per row.
void Interleave(uint8_t* data, int64_t rows, int64_t blocks, int64_t unit) {
  const int64_t G = kPackRows, group_bytes = G * blocks * unit;
  std::vector<uint8_t> tmp(group_bytes);
  for (int64_t g = 0; g < rows / G; ++g) {
    uint8_t* base = data + g * group_bytes;
    std::memcpy(tmp.data(), base, group_bytes);
    for (int64_t j = 0; j < G; ++j) {
      for (int64_t b = 0; b < blocks; ++b) {
        std::memcpy(base + (b * G + j) * unit, tmp.data() + (j * blocks + b) * unit, unit);
      }
    }
  }
}

}  // namespace

bool CanPack(const Weight& w) {
  return (w.format == WeightFormat::kBF16 || w.format == WeightFormat::kMxfp4) && !w.packed &&
         w.rows > 0 && w.rows % kPackRows == 0 && w.cols % 32 == 0;
}

void PackInPlace(Weight* w) {
  if (!CanPack(*w)) return;
  auto* data = const_cast<uint8_t*>(static_cast<const uint8_t*>(w->data));
  const int64_t blocks = w->cols / 32;
  if (w->format == WeightFormat::kBF16) {
    Interleave(data, w->rows, blocks, 64);
  } else {
    Interleave(data, w->rows, blocks, 16);
    Interleave(const_cast<uint8_t*>(w->scales), w->rows, blocks, 1);
  }
  w->packed = true;
}

}  // namespace kimi::cpu
