// Helpers for the CUDA kernel tests: skip without a GPU, device copies of host vectors, and the
// comparison every test states its tolerance with.
//
// Tolerances: each test compares against the CPU kernel (kernels/cpu) on random inputs. fp32 on
// both sides unless stated; the GPU sums in another order (tree reductions, one product per k
// instead of 16 lanes), so results agree to a few fp32 ulps of the magnitudes summed -- the tests
// allow 1e-5 relative to the sum of absolute terms (or to the output's magnitude where the terms
// are of one sign), far below what any indexing or formula bug produces.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/batch.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_buffer.h"

namespace kimi::cuda::testing {

// Skips the test (with the reason) when there is no GPU; use as the test's first statement.
#define KIMI_REQUIRE_GPU()                                                                    \
  do {                                                                                       \
    if (::kimi::cuda::DeviceCount() == 0) {                                                  \
      GTEST_SKIP() << "no GPU (" << ::kimi::cuda::DescribeDevice()                           \
                   << "): CUDA kernel tests run on a machine with one (scripts/gpu-check.sh)"; \
    }                                                                                        \
  } while (0)

// A device copy of a host vector; ASSERT-style failures end the calling test.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(static_cast<int64_t>(host.size())) {
    auto b = DeviceBuffer::Allocate(n_ * static_cast<int64_t>(sizeof(T)));
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return;
    buf_ = std::move(*b);
    const absl::Status s = CopyToDevice(buf_.get(), host.data(), n_ * static_cast<int64_t>(sizeof(T)));
    EXPECT_TRUE(s.ok()) << s;
  }
  explicit DeviceVector(int64_t n) : DeviceVector(std::vector<T>(n)) {}
  T* get() const { return buf_.as<T>(); }
  std::vector<T> Host() const {
    std::vector<T> out(n_);
    const absl::Status s = CopyToHost(out.data(), buf_.get(), n_ * static_cast<int64_t>(sizeof(T)));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

 private:
  int64_t n_;
  DeviceBuffer buf_;
};

// Waits for the device and fails the test on a pending error.
inline void Sync() {
  const cudaError_t e = cudaDeviceSynchronize();
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
}

// max over i of |got - want| / (abs_tol + rel_tol * scale[i]); <= 1 passes.
inline double WorstRatio(const std::vector<float>& got, const std::vector<float>& want,
                         const std::vector<float>& scale, double abs_tol, double rel_tol) {
  double worst = 0.0;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double s = scale.empty() ? std::fabs(want[i]) : scale[i];
    const double r = std::fabs(static_cast<double>(got[i]) - want[i]) / (abs_tol + rel_tol * s);
    if (!(r <= worst)) worst = r;  // NaN propagates as a failure
  }
  return worst;
}

// A step's sequences (tokens in order, one after another) as a DeviceBatch. A sequence with
// slot -1 is padding: its tokens get tok_seq -1.
struct HostSeq {
  int32_t count = 1;
  int32_t pos0 = 0;
  int32_t slot = 0;
  std::vector<int32_t> pages;
};

class DeviceBatchOf {
 public:
  explicit DeviceBatchOf(const std::vector<HostSeq>& seqs) {
    std::vector<int32_t> off, count, pos0, slot, start, pages, tok_seq, tok_pos;
    int32_t t = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const HostSeq& s = seqs[i];
      off.push_back(t);
      count.push_back(s.count);
      pos0.push_back(s.pos0);
      slot.push_back(s.slot);
      start.push_back(static_cast<int32_t>(pages.size()));
      pages.insert(pages.end(), s.pages.begin(), s.pages.end());
      for (int32_t j = 0; j < s.count; ++j, ++t) {
        tok_seq.push_back(s.slot < 0 ? -1 : static_cast<int32_t>(i));
        tok_pos.push_back(s.pos0 + j);
      }
    }
    pages.push_back(0);  // never empty
    for (auto* v : {&off, &count, &pos0, &slot, &start, &pages, &tok_seq, &tok_pos}) {
      if (v->empty()) v->push_back(0);
      arrays_.emplace_back(*v);
    }
    batch.seq_offset = arrays_[0].get();
    batch.seq_count = arrays_[1].get();
    batch.seq_pos0 = arrays_[2].get();
    batch.seq_slot = arrays_[3].get();
    batch.seq_page_start = arrays_[4].get();
    batch.pages = arrays_[5].get();
    batch.tok_seq = arrays_[6].get();
    batch.tok_pos = arrays_[7].get();
    batch.num_seqs = static_cast<int64_t>(seqs.size());
    batch.num_tokens = t;
  }
  DeviceBatch batch;

 private:
  std::vector<DeviceVector<int32_t>> arrays_;
};

}  // namespace kimi::cuda::testing
