// Host-side parts of the CUDA backend that run without a GPU.
#include "engine/cuda/device_model.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/pack.h"

namespace kimi::gpu {
namespace {

// What the GPU receives from a weight the CPU loader packed in place is the checkpoint's
// row-major bytes, for bf16 and MXFP4 (data and scales), in every layout that fits the format.
TEST(DeviceModel, RowMajorBytesUndoesCpuPacking) {
  std::mt19937 rng(1);
  for (const auto& [f, layout] : {std::pair{WeightFormat::kBF16, PackLayout::kBlocks},
                                  {WeightFormat::kBF16, PackLayout::kLanes},
                                  {WeightFormat::kBF16, PackLayout::kTiles},
                                  {WeightFormat::kMxfp4, PackLayout::kBlocks},
                                  {WeightFormat::kMxfp4, PackLayout::kLanes},
                                  {WeightFormat::kMxfp4, PackLayout::kPairs}}) {
    const int64_t group = PackGroupRows(layout), rows = 3 * group, cols = 96;
    std::vector<uint8_t> data(f == WeightFormat::kBF16 ? rows * cols * 2 : rows * cols / 2);
    std::vector<uint8_t> scales(f == WeightFormat::kMxfp4 ? rows * cols / 32 : 0);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    for (auto& b : scales) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> packed = data, packed_scales = scales;
    Weight w;
    w.data = packed.data();
    w.scales = packed_scales.empty() ? nullptr : packed_scales.data();
    w.format = f;
    w.rows = rows;
    w.cols = cols;
    cpu::PackInPlace(&w, layout);
    ASSERT_TRUE(w.packed);
    ASSERT_NE(packed, data);  // the layout did change
    std::vector<uint8_t> got, got_scales;
    RowMajorBytes(w, &got, &got_scales);
    EXPECT_EQ(got, data);
    EXPECT_EQ(got_scales, scales);
    // A view of whole groups (what Weight::Rows gives) unpacks to its rows.
    const Weight view = w.Rows(group, group);
    RowMajorBytes(view, &got, &got_scales);
    const int64_t row_bytes = static_cast<int64_t>(data.size()) / rows;
    EXPECT_EQ(got, std::vector<uint8_t>(data.begin() + group * row_bytes,
                                        data.begin() + 2 * group * row_bytes));
  }
}

}  // namespace
}  // namespace kimi::gpu
