#include "kernels/cuda/gemm.h"

#include <cuda_runtime_api.h>

#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cublaslt_api.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/weight_gemm.h"

namespace kimi::cuda {
namespace {

// The cuBLASLt entry points; Gemm::Create has loaded them before anything here runs.
const CublasLtApi& Lt() {
  static const CublasLtApi* api = *LoadCublasLt();
  return *api;
}

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt: ", what, ": ", Lt().GetStatusName(s), " (",
                                          Lt().GetStatusString(s), ")"));
}

// The largest power of two (at most 256) dividing the address.
uint32_t Alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

int64_t Round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Row-major y[m, n] = x[m, k] w[n, k]^T is, column-major, D[n, m] = op(A)[n, k] B[k, m] with
// A = w seen as [k, n] (ld k) transposed and B = x seen as [k, m] (ld ldx).
struct Shape {
  int64_t n = 0, k = 0, m = 0, ldx = 0, ldy = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0;
  bool accumulate = false;
  auto Tie() const { return std::tie(n, k, m, ldx, ldy, align_a, align_b, align_c, accumulate); }
  bool operator<(const Shape& o) const { return Tie() < o.Tie(); }
};

struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Descs() = default;
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
  ~Descs() {
    if (c) Lt().MatrixLayoutDestroy(c);
    if (b) Lt().MatrixLayoutDestroy(b);
    if (a) Lt().MatrixLayoutDestroy(a);
    if (op) Lt().MatmulDescDestroy(op);
  }
  absl::Status Init(const Shape& s) {
    KIMI_RETURN_IF_ERROR(LtStatus(Lt().MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                  "cublasLtMatmulDescCreate"));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    KIMI_RETURN_IF_ERROR(LtStatus(
        Lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA"));
    KIMI_RETURN_IF_ERROR(LtStatus(
        Lt().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB"));
    KIMI_RETURN_IF_ERROR(LtStatus(
        Lt().MatrixLayoutCreate(&a, CUDA_R_16BF, static_cast<uint64_t>(s.k),
                                   static_cast<uint64_t>(s.n), s.k),
        "layout A"));
    KIMI_RETURN_IF_ERROR(LtStatus(
        Lt().MatrixLayoutCreate(&b, CUDA_R_16BF, static_cast<uint64_t>(s.k),
                                   static_cast<uint64_t>(s.m), s.ldx),
        "layout B"));
    return LtStatus(Lt().MatrixLayoutCreate(&c, CUDA_R_32F, static_cast<uint64_t>(s.n),
                                               static_cast<uint64_t>(s.m), s.ldy),
                    "layout C");
  }
};

struct Plan {
  std::unique_ptr<Descs> d;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool library = false;  // false: no usable cuBLASLt algorithm (Linear falls back to WeightGemm)
};

}  // namespace

struct Gemm::Impl {
  Options options;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  DeviceBuffer scratch;  // bf16 activations: hi, then lo at lo_offset
  int64_t scratch_elements = 0;
  int64_t lo_offset = 0;
  std::map<Shape, Plan> plans;
  std::map<Shape, std::optional<cublasLtMatmulAlgo_t>> pinned;  // keyed with m = 0

  ~Impl() {
    plans.clear();
    if (handle) Lt().Destroy(handle);
  }

  absl::Status Heuristics(const Shape& s, const Descs& d, int count,
                          std::vector<cublasLtMatmulHeuristicResult_t>* out) {
    out->clear();
    cublasLtMatmulPreference_t pref = nullptr;
    KIMI_RETURN_IF_ERROR(LtStatus(Lt().MatmulPreferenceCreate(&pref), "preference"));
    const uint64_t ws = static_cast<uint64_t>(workspace.bytes());
    absl::Status st = LtStatus(Lt().MatmulPreferenceSetAttribute(
                                   pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                               "workspace preference");
    const uint32_t aligns[4] = {s.align_a, s.align_b, s.align_c, s.align_c};
    const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && st.ok(); ++i) {
      st = LtStatus(Lt().MatmulPreferenceSetAttribute(pref, attrs[i], &aligns[i], sizeof aligns[i]),
                    "alignment preference");
    }
    if (st.ok()) {
      std::vector<cublasLtMatmulHeuristicResult_t> r(count);
      int returned = 0;
      const cublasStatus_t hs = Lt().MatmulAlgoGetHeuristic(handle, d.op, d.a, d.b, d.c, d.c, pref,
                                                               count, r.data(), &returned);
      // NOT_SUPPORTED means no algorithm for this shape: an empty list, not an error.
      if (hs != CUBLAS_STATUS_NOT_SUPPORTED) st = LtStatus(hs, "cublasLtMatmulAlgoGetHeuristic");
      for (int i = 0; st.ok() && i < returned; ++i) {
        if (r[i].state == CUBLAS_STATUS_SUCCESS) out->push_back(r[i]);
      }
    }
    Lt().MatmulPreferenceDestroy(pref);
    return st;
  }

  // True when `algo` runs shape `s` within the workspace; its workspace size in *ws.
  bool Supports(const Shape& s, const cublasLtMatmulAlgo_t& algo, size_t* ws) {
    Descs d;
    if (!d.Init(s).ok()) return false;
    cublasLtMatmulHeuristicResult_t r{};
    if (Lt().MatmulAlgoCheck(handle, d.op, d.a, d.b, d.c, d.c, &algo, &r) != CUBLAS_STATUS_SUCCESS) {
      return false;
    }
    if (ws) *ws = r.workspaceSize;
    return r.workspaceSize <= static_cast<size_t>(workspace.bytes());
  }

  // The algorithm used for every m of a (n, k, strides, alignment) key: the heuristic's first
  // candidate (probed at m = 256) without split-K or a reduction scheme that runs at m = 1, 16,
  // 256 and 4096.
  absl::StatusOr<std::optional<cublasLtMatmulAlgo_t>> ChoosePinned(const Shape& s) {
    Shape probe = s;
    probe.m = 256;
    Descs d;
    KIMI_RETURN_IF_ERROR(d.Init(probe));
    std::vector<cublasLtMatmulHeuristicResult_t> cands;
    KIMI_RETURN_IF_ERROR(Heuristics(probe, d, 32, &cands));
    for (const auto& c : cands) {
      int32_t splitk = 1;
      uint32_t reduction = 0;
      size_t written = 0;
      if (Lt().MatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                               sizeof splitk, &written) != CUBLAS_STATUS_SUCCESS ||
          Lt().MatmulAlgoConfigGetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                               &reduction, sizeof reduction,
                                               &written) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      if (splitk > 1 || reduction != CUBLASLT_REDUCTION_SCHEME_NONE) continue;
      bool all = true;
      for (int64_t m : {int64_t{1}, int64_t{16}, int64_t{256}, int64_t{4096}}) {
        Shape t = s;
        t.m = m;
        if (t.ldx < t.k) t.ldx = t.k;
        all = all && Supports(t, c.algo, nullptr);
      }
      if (all) return std::optional<cublasLtMatmulAlgo_t>(c.algo);
    }
    return std::optional<cublasLtMatmulAlgo_t>();
  }

  absl::StatusOr<Plan*> GetPlan(const Shape& s) {
    auto it = plans.find(s);
    if (it != plans.end()) return &it->second;
    Plan p;
    p.d = std::make_unique<Descs>();
    KIMI_RETURN_IF_ERROR(p.d->Init(s));
    if (options.batch_invariant) {
      Shape key = s;
      key.m = 0;
      auto pit = pinned.find(key);
      if (pit == pinned.end()) {
        absl::StatusOr<std::optional<cublasLtMatmulAlgo_t>> chosen = ChoosePinned(s);
        if (!chosen.ok()) return chosen.status();
        pit = pinned.emplace(key, *chosen).first;
      }
      size_t ws = 0;
      if (pit->second && Supports(s, *pit->second, &ws)) {
        p.algo = *pit->second;
        p.workspace = ws;
        p.library = true;
      }
    } else {
      std::vector<cublasLtMatmulHeuristicResult_t> r;
      KIMI_RETURN_IF_ERROR(Heuristics(s, *p.d, 1, &r));
      if (!r.empty()) {
        p.algo = r[0].algo;
        p.workspace = r[0].workspaceSize;
        p.library = true;
      }
    }
    return &plans.emplace(s, std::move(p)).first->second;
  }

  absl::Status Run(const Plan& p, float* y, const uint16_t* x, const uint16_t* w, bool accumulate,
                   const cublasLtMatmulAlgo_t* algo, size_t ws, cudaStream_t stream) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return LtStatus(Lt().Matmul(handle, p.d->op, &alpha, w, p.d->a, x, p.d->b, &beta, y, p.d->c, y,
                                   p.d->c, algo, workspace.get(), ws, stream),
                    "cublasLtMatmul");
  }
};

Gemm::Gemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gemm::~Gemm() = default;

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.use_library) {
    absl::StatusOr<const CublasLtApi*> lt = LoadCublasLt();
    if (!lt.ok()) return lt.status();
    KIMI_RETURN_IF_ERROR(LtStatus(Lt().Create(&impl->handle), "cublasLtCreate"));
  }
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(options.workspace_bytes);
  if (!ws.ok()) return ws.status();
  impl->workspace = std::move(*ws);
  return std::unique_ptr<Gemm>(new Gemm(std::move(impl)));
}

absl::Status Gemm::Reserve(int64_t elements) {
  if (elements <= impl_->scratch_elements) return absl::OkStatus();
  const int64_t half = Round256(elements * 2);
  impl_->scratch.Reset();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(2 * half);
  if (!b.ok()) {
    impl_->scratch_elements = 0;
    return b.status();
  }
  impl_->scratch = std::move(*b);
  impl_->scratch_elements = elements;
  impl_->lo_offset = half;
  return absl::OkStatus();
}

absl::Status Gemm::Linear(float* y, int64_t ldy, const float* x, int64_t ldx, const Weight& w,
                          int64_t m, GemmPrecision precision, cudaStream_t stream) {
  if (m <= 0 || w.rows <= 0) return absl::OkStatus();
  if (w.format != WeightFormat::kBF16 || w.packed || !impl_->options.use_library) {
    return WeightGemm(y, ldy, x, ldx, w, m, stream);
  }
  const int64_t n = w.rows, k = w.cols;
  if (m * k > impl_->scratch_elements) {
    return absl::FailedPreconditionError(absl::StrCat("Gemm: ", m, " x ", k,
                                                      " activations exceed the reserved ",
                                                      impl_->scratch_elements));
  }
  auto* hi = impl_->scratch.as<uint16_t>();
  auto* lo = reinterpret_cast<uint16_t*>(impl_->scratch.as<char>() + impl_->lo_offset);
  const bool split = precision == GemmPrecision::kSplit;
  Shape s{n, k, m, k, ldy, Alignment(w.data), Alignment(hi), Alignment(y), false};
  absl::StatusOr<Plan*> plan = impl_->GetPlan(s);
  if (!plan.ok()) return plan.status();
  Plan* plan_lo = nullptr;
  if (split) {
    Shape s2 = s;
    s2.align_b = Alignment(lo);
    s2.accumulate = true;
    absl::StatusOr<Plan*> p2 = impl_->GetPlan(s2);
    if (!p2.ok()) return p2.status();
    plan_lo = *p2;
  }
  if (!(*plan)->library || (plan_lo && !plan_lo->library)) {
    return WeightGemm(y, ldy, x, ldx, w, m, stream);
  }
  KIMI_RETURN_IF_ERROR(SplitToBf16(hi, split ? lo : nullptr, x, ldx, m, k, stream));
  const auto* wd = static_cast<const uint16_t*>(w.data);
  KIMI_RETURN_IF_ERROR(impl_->Run(**plan, y, hi, wd, false, &(*plan)->algo, (*plan)->workspace, stream));
  if (split) {
    KIMI_RETURN_IF_ERROR(impl_->Run(*plan_lo, y, lo, wd, true, &plan_lo->algo, plan_lo->workspace, stream));
  }
  return absl::OkStatus();
}

absl::Status Gemm::MatmulBf16(float* y, int64_t ldy, const uint16_t* x, int64_t ldx,
                              const uint16_t* w, int64_t n, int64_t k, int64_t m, bool accumulate,
                              cudaStream_t stream) {
  if (m <= 0 || n <= 0) return absl::OkStatus();
  const Shape s{n, k, m, ldx, ldy, Alignment(w), Alignment(x), Alignment(y), accumulate};
  absl::StatusOr<Plan*> plan = impl_->GetPlan(s);
  if (!plan.ok()) return plan.status();
  if (!(*plan)->library) {
    return absl::UnimplementedError(
        absl::StrCat("Gemm: no cuBLASLt algorithm for n ", n, ", k ", k, ", m ", m));
  }
  return impl_->Run(**plan, y, x, w, accumulate, &(*plan)->algo, (*plan)->workspace, stream);
}

absl::StatusOr<double> Gemm::BestAlgorithmMs(float* y, const uint16_t* x, const uint16_t* w,
                                             int64_t n, int64_t k, int64_t m, int reps,
                                             cudaStream_t stream) {
  const Shape s{n, k, m, k, n, Alignment(w), Alignment(x), Alignment(y), false};
  Plan p;
  p.d = std::make_unique<Descs>();
  KIMI_RETURN_IF_ERROR(p.d->Init(s));
  std::vector<cublasLtMatmulHeuristicResult_t> cands;
  KIMI_RETURN_IF_ERROR(impl_->Heuristics(s, *p.d, 32, &cands));
  if (cands.empty()) return absl::UnimplementedError("BestAlgorithmMs: no cuBLASLt algorithm");
  cudaEvent_t start = nullptr, stop = nullptr;
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  absl::Status st = CudaStatus(cudaEventCreate(&stop), "cudaEventCreate");
  double best = -1.0;
  for (const auto& c : cands) {
    if (!st.ok()) break;
    // One warm-up; an algorithm that fails to run is skipped.
    if (!impl_->Run(p, y, x, w, false, &c.algo, c.workspaceSize, stream).ok()) continue;
    st = CudaStatus(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int r = 0; st.ok() && r < reps; ++r) {
      st = impl_->Run(p, y, x, w, false, &c.algo, c.workspaceSize, stream);
    }
    if (st.ok()) st = CudaStatus(cudaEventRecord(stop, stream), "cudaEventRecord");
    if (st.ok()) st = CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    if (st.ok()) st = CudaStatus(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (st.ok() && (best < 0 || ms / reps < best)) best = ms / reps;
  }
  cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (!st.ok()) return st;
  if (best < 0) return absl::InternalError("BestAlgorithmMs: no candidate ran");
  return best;
}

int64_t Gemm::cached_plans() const { return static_cast<int64_t>(impl_->plans.size()); }

}  // namespace kimi::cuda
