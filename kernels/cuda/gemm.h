// Dense GEMMs through cuBLASLt: y[m, n] (fp32) = x[m, k] W^T for bf16 weights W [n, k] (row-major,
// as stored), bf16 operands, fp32 accumulation, with an algorithm cache keyed by shape, strides,
// alignment and dtypes. Activations stay fp32 in device memory and are converted right before the
// product, in one of two precisions:
//   kBf16   x rounded to bf16: one product (the fast path);
//   kSplit  x = hi + lo, both bf16: two products accumulated in fp32 (x carried to about 2^-17
//           relative, i.e. close to the CPU engine's fp32 activations) at twice the cost.
// Weights in other formats (fp32, fp16, MXFP4) go to WeightGemm (kernels/cuda/weight_gemm.h).
//
// Batch invariance: with `batch_invariant`, one algorithm is pinned per (n, k, strides) for every
// m -- chosen among cuBLASLt's candidates without split-K or a reduction scheme, so each output
// element is one CTA's sum over k in a fixed order -- and a row's result does not depend on how
// many rows share the product. Without it the heuristic's best algorithm is used per m.
//
// use_library = false sends every product to WeightGemm instead (a fallback that does not depend
// on cuBLASLt's kernels).
//
// Thread contract: one thread uses a Gemm at a time (the engine thread). Plans are created on
// first use of a shape, so run every shape once before capturing a CUDA graph.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/weight.h"

typedef struct CUstream_st* cudaStream_t;

namespace kimi::cuda {

enum class GemmPrecision { kBf16, kSplit };

class Gemm {
 public:
  struct Options {
    bool batch_invariant = true;
    // false: every product through WeightGemm (fp32 activations, weights converted in the kernel;
    // slower, batch-invariant by construction, no cuBLASLt).
    bool use_library = true;
    int64_t workspace_bytes = int64_t{32} << 20;
  };
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(const Options& options);
  static absl::StatusOr<std::unique_ptr<Gemm>> Create() { return Create(Options{}); }
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Room for the bf16 copies of activations of up to `elements` (m * k) values. Linear never
  // allocates; it fails with FailedPrecondition when the room is short.
  absl::Status Reserve(int64_t elements);

  // y [m, w.rows] (row stride ldy) = x [m, w.cols] (row stride ldx) W^T, w in device memory.
  absl::Status Linear(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                      int64_t m, GemmPrecision precision, cudaStream_t stream);

  // bf16 operands as they are: y [m, n] (ldy) = x [m, k] (ldx) w [n, k]^T (+ y if accumulate).
  absl::Status MatmulBf16(float* y, int64_t ldy, const uint16_t* x, int64_t ldx, const uint16_t* w,
                          int64_t n, int64_t k, int64_t m, bool accumulate, cudaStream_t stream);

  // Benchmarks: milliseconds per call of the fastest of cuBLASLt's candidate algorithms (up to
  // 32, each timed `reps` times) for MatmulBf16's shape with dense strides.
  absl::StatusOr<double> BestAlgorithmMs(float* y, const uint16_t* x, const uint16_t* w, int64_t n,
                                         int64_t k, int64_t m, int reps, cudaStream_t stream);

  int64_t cached_plans() const;

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi::cuda
