#include "kernels/cuda/weight_gemm.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kBM = static_cast<int>(kWeightGemmTileRows);  // rows of x per tile
constexpr int kBN = 64;                                     // weight rows (outputs) per tile
constexpr int kBK = 32;                                     // one MXFP4 scale block
constexpr int kThreads = 256;
constexpr int kRowsPerThread = kBM * kBN / kThreads;        // 4

struct Args {
  float* y;
  int64_t ldy, y_stride;
  const float* x;
  int64_t ldx, x_stride;
  const void* w;
  const uint8_t* scales;
  int64_t w_row_stride;  // weight rows between batches / groups
  int64_t n, k, m;
  const int32_t* tile_group;  // null: dense or batched
  const int32_t* tile_row0;
  const int32_t* tile_row_end;
  const int32_t* num_tiles;
};

// ws[c][kk] = W(wrow0 + n0 + c, k0 + kk) as fp32, zero outside the matrix.
template <WeightFormat F>
__device__ __forceinline__ void LoadWeightTile(float (*ws)[kBK + 1], const Args& a, int64_t wrow0,
                                               int64_t n0, int64_t k0) {
  if constexpr (F == WeightFormat::kMxfp4) {
    // 64 rows x 16 bytes: 4 bytes (8 codes) per thread. k % 32 == 0, so a block is whole.
    const int c = threadIdx.x / 4, part = threadIdx.x % 4;
    const bool in = n0 + c < a.n;
    const int64_t r = wrow0 + n0 + c;
    uint32_t bytes = 0;
    float scale = 0.0f;
    if (in) {
      const uint8_t* row = static_cast<const uint8_t*>(a.w) + r * (a.k / 2) + k0 / 2;
      bytes = reinterpret_cast<const uint32_t*>(row)[part];
      scale = dev::E8m0ToF32(a.scales[r * (a.k / 32) + k0 / 32]);
    }
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (bytes >> (8 * b)) & 0xffu;
      ws[c][part * 8 + 2 * b] = in ? dev::E2m1ToF32(byte & 0xfu) * scale : 0.0f;
      ws[c][part * 8 + 2 * b + 1] = in ? dev::E2m1ToF32(byte >> 4) * scale : 0.0f;
    }
  } else {
    for (int i = threadIdx.x; i < kBN * kBK; i += kThreads) {
      const int c = i / kBK, kk = i % kBK;
      const int64_t gk = k0 + kk;
      float v = 0.0f;
      if (n0 + c < a.n && gk < a.k) {
        const int64_t idx = (wrow0 + n0 + c) * a.k + gk;
        if constexpr (F == WeightFormat::kF32) v = static_cast<const float*>(a.w)[idx];
        if constexpr (F == WeightFormat::kBF16) v = dev::Bf16ToF32(static_cast<const uint16_t*>(a.w)[idx]);
        if constexpr (F == WeightFormat::kF16) v = dev::F16ToF32(static_cast<const uint16_t*>(a.w)[idx]);
      }
      ws[c][kk] = v;
    }
  }
}

// grid: x = output column tiles, y = row tiles (dense/batched) or tile list (grouped), z = batch.
template <WeightFormat F>
__global__ void __launch_bounds__(kThreads) WeightGemmKernel(Args a) {
  __shared__ float xs[kBM][kBK + 1];
  __shared__ float ws[kBN][kBK + 1];
  int64_t row0, row_end, wrow0;
  if (a.tile_group) {
    if (static_cast<int64_t>(blockIdx.y) >= *a.num_tiles) return;
    row0 = a.tile_row0[blockIdx.y];
    const int64_t end = a.tile_row_end[blockIdx.y];
    row_end = row0 + kBM < end ? row0 + kBM : end;
    wrow0 = static_cast<int64_t>(a.tile_group[blockIdx.y]) * a.w_row_stride;
  } else {
    row0 = static_cast<int64_t>(blockIdx.y) * kBM;
    row_end = row0 + kBM < a.m ? row0 + kBM : a.m;
    wrow0 = static_cast<int64_t>(blockIdx.z) * a.w_row_stride;
  }
  const float* x = a.x + static_cast<int64_t>(blockIdx.z) * a.x_stride;
  float* y = a.y + static_cast<int64_t>(blockIdx.z) * a.y_stride;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int col = threadIdx.x % kBN, rq = threadIdx.x / kBN;
  float acc[kRowsPerThread] = {};
  for (int64_t k0 = 0; k0 < a.k; k0 += kBK) {
    for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {
      const int r = i / kBK, kk = i % kBK;
      const int64_t gr = row0 + r, gk = k0 + kk;
      xs[r][kk] = gr < row_end && gk < a.k ? x[gr * a.ldx + gk] : 0.0f;
    }
    LoadWeightTile<F>(ws, a, wrow0, n0, k0);
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kBK; ++kk) {
      const float wv = ws[col][kk];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) acc[i] = fmaf(xs[rq + 4 * i][kk], wv, acc[i]);
    }
    __syncthreads();
  }
  const int64_t gc = n0 + col;
  if (gc >= a.n) return;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int64_t gr = row0 + rq + 4 * i;
    if (gr < row_end) y[gr * a.ldy + gc] = acc[i];
  }
}

absl::Status Launch(const Args& a, const Weight& w, dim3 grid, cudaStream_t stream) {
  if (w.packed) return absl::InvalidArgumentError("WeightGemm: packed weights are CPU-only");
  if (w.format == WeightFormat::kMxfp4 && (a.k % 32 != 0 || !w.scales)) {
    return absl::InvalidArgumentError(
        absl::StrCat("WeightGemm: MXFP4 weight with ", a.k, " columns (need a multiple of 32)"));
  }
  if (grid.y > 65535 || grid.z > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("WeightGemm: grid ", grid.x, "x", grid.y, "x", grid.z, " too large"));
  }
  switch (w.format) {
    case WeightFormat::kF32:
      WeightGemmKernel<WeightFormat::kF32><<<grid, kThreads, 0, stream>>>(a);
      break;
    case WeightFormat::kF16:
      WeightGemmKernel<WeightFormat::kF16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case WeightFormat::kBF16:
      WeightGemmKernel<WeightFormat::kBF16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case WeightFormat::kMxfp4:
      WeightGemmKernel<WeightFormat::kMxfp4><<<grid, kThreads, 0, stream>>>(a);
      break;
  }
  return LaunchStatus("WeightGemmKernel");
}

unsigned Tiles(int64_t n, int64_t t) { return static_cast<unsigned>((n + t - 1) / t); }

}  // namespace

absl::Status WeightGemmBatched(float* y, int64_t ldy, int64_t y_stride, const float* x,
                               int64_t ldx, int64_t x_stride, const Weight& w, int64_t n,
                               int64_t w_row_stride, int64_t m, int64_t batch,
                               cudaStream_t stream) {
  if (m <= 0 || n <= 0 || batch <= 0) return absl::OkStatus();
  if ((batch - 1) * w_row_stride + n > w.rows) {
    return absl::InvalidArgumentError(absl::StrCat("WeightGemm: rows up to ",
                                                   (batch - 1) * w_row_stride + n, " of a ",
                                                   w.rows, "-row weight"));
  }
  const Args a{y, ldy, y_stride, x, ldx, x_stride, w.data, w.scales, w_row_stride, n, w.cols, m,
               nullptr, nullptr, nullptr, nullptr};
  return Launch(a, w, dim3(Tiles(n, kBN), Tiles(m, kBM), static_cast<unsigned>(batch)), stream);
}

absl::Status WeightGemm(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                        int64_t m, cudaStream_t stream) {
  return WeightGemmBatched(y, ldy, 0, x, ldx, 0, w, w.rows, 0, m, 1, stream);
}

absl::Status WeightGemmGrouped(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                               int64_t n, const int32_t* tile_group, const int32_t* tile_row0,
                               const int32_t* tile_row_end, const int32_t* num_tiles,
                               int64_t max_tiles, cudaStream_t stream) {
  if (n <= 0 || max_tiles <= 0) return absl::OkStatus();
  if (w.rows % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("WeightGemmGrouped: ", w.rows, " weight rows are not groups of ", n));
  }
  const Args a{y, ldy, 0, x, ldx, 0, w.data, w.scales, n, n, w.cols, 0,
               tile_group, tile_row0, tile_row_end, num_tiles};
  return Launch(a, w, dim3(Tiles(n, kBN), static_cast<unsigned>(max_tiles), 1), stream);
}

}  // namespace kimi::cuda
