#include "engine/cuda/cuda_step_runner.h"

#include <algorithm>
#include <map>
#include <set>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "engine/cuda/device_model.h"
#include "engine/cuda/device_state.h"
#include "engine/cuda/forward.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"

namespace kimi {
namespace {

using cuda::CudaStatus;

// State ops go to device memory; a failure is kept for the next Run() (Apply cannot return it).
class CudaStateSink final : public StateOpSink {
 public:
  CudaStateSink(gpu::DeviceState* state, cudaStream_t* stream, int device, absl::Status* sticky)
      : state_(state), stream_(stream), device_(device), sticky_(sticky) {}
  void Apply(StateOp op) override {
    absl::Status s = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
    if (s.ok()) s = state_->Apply(op, *stream_);
    if (!s.ok() && sticky_->ok()) *sticky_ = s;
  }

 private:
  gpu::DeviceState* state_;
  cudaStream_t* stream_;
  int device_;
  absl::Status* sticky_;
};

class CudaStepRunner final : public StepRunner {
 public:
  CudaStepRunner(const Model& model, int64_t slots, int64_t pages, int64_t page_size, int device,
                 const CudaRunnerOptions& options)
      : model_(model),
        device_(device),
        options_(options),
        kda_host_(model.config(), slots),
        kv_host_(model.config(), pages, page_size),
        sink_(nullptr, &stream_, device, &sticky_) {}

  ~CudaStepRunner() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    DropGraphs();
    forward_.reset();
    gemm_.reset();
    state_.reset();
    dmodel_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init(int64_t slots, int64_t pages, int64_t page_size) {
    const int n = cuda::DeviceCount();
    if (device_ < 0 || device_ >= n) {
      return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device_, " not available (",
                                                        n, " devices; ", cuda::DescribeDevice(),
                                                        ")"));
    }
    KIMI_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    KIMI_RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    absl::StatusOr<std::unique_ptr<gpu::DeviceModel>> dm = gpu::DeviceModel::Upload(model_);
    if (!dm.ok()) return dm.status();
    dmodel_ = std::move(*dm);
    stats_.weight_bytes = dmodel_->bytes();
    absl::StatusOr<std::unique_ptr<gpu::DeviceState>> ds =
        gpu::DeviceState::Create(model_.config(), slots, pages, page_size);
    if (!ds.ok()) return ds.status();
    state_ = std::move(*ds);
    sink_ = CudaStateSink(state_.get(), &stream_, device_, &sticky_);
    cuda::Gemm::Options go;
    go.batch_invariant = options_.batch_invariant;
    go.use_library = options_.gemm_library;
    absl::StatusOr<std::unique_ptr<cuda::Gemm>> g = cuda::Gemm::Create(go);
    if (!g.ok()) return g.status();
    gemm_ = std::move(*g);
    forward_ = std::make_unique<gpu::Forward>(
        *dmodel_, *state_, *gemm_,
        options_.fp32_activations ? cuda::GemmPrecision::kSplit : cuda::GemmPrecision::kBf16);
    const int64_t graph_rows = std::max<int64_t>(options_.max_graph_batch, 1);
    bool moved = false;
    return forward_->Reserve(std::max(options_.reserve_tokens, graph_rows), graph_rows,
                             std::max<int64_t>(pages, 64), graph_rows, &moved);
  }

  EngineState state() override { return {&kda_host_, &kv_host_}; }
  StateOpSink* ops() override { return &sink_; }
  const CudaRunnerStats& stats() const { return stats_; }

  absl::Status Run(std::span<const SequenceStep> batch, StepOutput* out) override;

 private:
  void DropGraphs() {
    for (auto& [bucket, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
    seen_.clear();
  }
  // The graph bucket of a decode step of `seqs` sequences, or 0 for an eager step.
  int64_t BucketFor(int64_t seqs) const {
    if (options_.max_graph_batch <= 0 || seqs > options_.max_graph_batch) return 0;
    int64_t b = 1;
    while (b < seqs) b *= 2;
    return std::min(b, options_.max_graph_batch);
  }
  absl::Status Launch(int64_t bucket, const gpu::StepShape& shape);

  const Model& model_;
  int device_;
  CudaRunnerOptions options_;
  KdaStatePool kda_host_;
  MlaKvCache kv_host_;
  absl::Status sticky_;
  cudaStream_t stream_ = nullptr;
  CudaStateSink sink_;
  std::unique_ptr<gpu::DeviceModel> dmodel_;
  std::unique_ptr<gpu::DeviceState> state_;
  std::unique_ptr<cuda::Gemm> gemm_;
  std::unique_ptr<gpu::Forward> forward_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
  std::set<int64_t> seen_, failed_;
  CudaRunnerStats stats_;
};

// Eager, replay, or capture-then-replay.
absl::Status CudaStepRunner::Launch(int64_t bucket, const gpu::StepShape& shape) {
  if (bucket > 0 && !failed_.count(bucket)) {
    auto it = graphs_.find(bucket);
    if (it != graphs_.end()) {
      ++stats_.graph_replays;
      return CudaStatus(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
    }
    if (seen_.count(bucket)) {
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      absl::Status s = CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                  "begin capture");
      if (s.ok()) {
        const absl::Status enq = forward_->Enqueue(shape, stream_);
        const absl::Status end = CudaStatus(cudaStreamEndCapture(stream_, &graph), "end capture");
        s = enq.ok() ? end : enq;
      }
      if (s.ok()) s = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
      if (graph) cudaGraphDestroy(graph);
      if (s.ok()) {
        graphs_[bucket] = exec;
        ++stats_.graph_captures;
        ++stats_.graph_replays;
        return CudaStatus(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
      }
      // Capture failed: this bucket runs eagerly from now on (nothing ran yet for this step).
      if (exec) cudaGraphExecDestroy(exec);
      cudaGetLastError();
      failed_.insert(bucket);
    } else {
      seen_.insert(bucket);
    }
  }
  ++stats_.eager_steps;
  return forward_->Enqueue(shape, stream_);
}

absl::Status CudaStepRunner::Run(std::span<const SequenceStep> batch, StepOutput* out) {
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  if (!sticky_.ok()) {
    const absl::Status s = sticky_;
    sticky_ = absl::OkStatus();
    return s;
  }
  const ModelConfig& c = model_.config();
  const int64_t page_size = state_->page_size();
  // Engine::Step's checks, so a bad batch fails before any device state is touched.
  KIMI_RETURN_IF_ERROR(
      ValidateBatch(c, batch, state_->num_slots(), state_->num_pages(), page_size));
  const bool has_mla = c.StageLayersOf(LayerKind::kMla) > 0;
  out->vocab = c.vocab;
  out->logits.clear();
  out->first_row.assign(batch.size(), -1);
  if (batch.empty()) return absl::OkStatus();
  ++stats_.steps;

  // Sizes, the logit rows (as Engine::Step orders them) and the page entries.
  const int64_t S = static_cast<int64_t>(batch.size());
  int64_t T = 0, page_entries = 0;
  bool decode_only = true, any_decode = false, any_prefill = false;
  std::vector<int32_t> rows;
  for (int64_t i = 0; i < S; ++i) {
    const SequenceStep& s = batch[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (s.logits != LogitsWanted::kNone) {
      out->first_row[i] = static_cast<int64_t>(rows.size());
      for (int64_t t = s.logits == LogitsWanted::kAll ? 0 : n - 1; t < n; ++t) {
        rows.push_back(static_cast<int32_t>(T + t));
      }
    }
    if (has_mla) page_entries += (s.pos0 + n + page_size - 1) / page_size;
    decode_only = decode_only && n == 1;
    any_decode = any_decode || n == 1;
    any_prefill = any_prefill || n > 1;
    T += n;
  }
  const int64_t bucket = decode_only ? BucketFor(S) : 0;
  gpu::StepShape shape;
  shape.tokens = bucket ? bucket : T;
  shape.seqs = bucket ? bucket : S;
  shape.logit_rows = bucket ? bucket : static_cast<int64_t>(rows.size());
  shape.has_decode = bucket ? true : any_decode;
  shape.has_prefill = bucket ? false : any_prefill;
  bool moved = false;
  const absl::Status reserved =
      forward_->Reserve(shape.tokens, shape.seqs, page_entries, shape.logit_rows, &moved);
  if (moved) DropGraphs();
  KIMI_RETURN_IF_ERROR(reserved);

  // The plan, in pinned staging memory (the previous step has finished with it).
  const gpu::PlanArrays& p = forward_->host_plan();
  int64_t off = 0, pe = 0;
  for (int64_t i = 0; i < S; ++i) {
    const SequenceStep& s = batch[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    p.seq_offset[i] = static_cast<int32_t>(off);
    p.seq_count[i] = static_cast<int32_t>(n);
    p.seq_pos0[i] = static_cast<int32_t>(s.pos0);
    p.seq_slot[i] = static_cast<int32_t>(s.kda_slot);
    p.seq_page_start[i] = static_cast<int32_t>(pe);
    if (has_mla) {
      const int64_t needed = (s.pos0 + n + page_size - 1) / page_size;
      for (int64_t j = 0; j < needed; ++j) p.pages[pe++] = s.pages[j];
    }
    for (int64_t t = 0; t < n; ++t) {
      p.tokens[off + t] = s.tokens[t];
      p.tok_seq[off + t] = static_cast<int32_t>(i);
      p.tok_pos[off + t] = static_cast<int32_t>(s.pos0 + t);
    }
    off += n;
  }
  for (int64_t i = S; i < shape.seqs; ++i) {  // graph padding: no-op sequences of one token
    p.seq_offset[i] = static_cast<int32_t>(i);
    p.seq_count[i] = 1;
    p.seq_pos0[i] = 0;
    p.seq_slot[i] = -1;
    p.seq_page_start[i] = static_cast<int32_t>(pe);
    p.tokens[i] = 0;
    p.tok_seq[i] = -1;
    p.tok_pos[i] = 0;
  }
  if (bucket) {
    for (int64_t r = 0; r < bucket; ++r) p.logit_rows[r] = static_cast<int32_t>(r);
  } else {
    std::copy(rows.begin(), rows.end(), p.logit_rows);
  }
  KIMI_RETURN_IF_ERROR(forward_->UploadPlan(stream_));
  KIMI_RETURN_IF_ERROR(Launch(bucket, shape));
  KIMI_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "step"));

  // Logits rows back, in Engine::Step's order.
  const int64_t V = c.vocab, n = static_cast<int64_t>(rows.size());
  out->logits.resize(n * V);
  if (!bucket || static_cast<int64_t>(rows.size()) == S) {  // device rows 0..n-1 are the output
    return CudaStatus(cudaMemcpy(out->logits.data(), forward_->logits(),
                                 static_cast<size_t>(n * V * 4), cudaMemcpyDeviceToHost),
                      "logits copy");
  }
  for (int64_t r = 0; r < n; ++r) {  // a decode graph computed a row per sequence
    KIMI_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(out->logits.data() + r * V,
                              forward_->logits() + static_cast<int64_t>(rows[r]) * V,
                              static_cast<size_t>(V * 4), cudaMemcpyDeviceToHost),
                   "logits copy"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaStepRunner(const Model& model, int64_t slots,
                                                               int64_t pages, int64_t page_size,
                                                               int device,
                                                               const CudaRunnerOptions& options) {
  if (page_size <= 0 || slots < 0 || pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeCudaStepRunner: ", slots, " slots, ", pages, " pages of ", page_size));
  }
  if (model.config().kda.state_dtype != KdaStateDtype::kF32) {
    return absl::InvalidArgumentError("MakeCudaStepRunner: the KDA state is fp32 on the GPU");
  }
  auto runner = std::make_unique<CudaStepRunner>(model, slots, pages, page_size, device, options);
  KIMI_RETURN_IF_ERROR(runner->Init(slots, pages, page_size));
  return std::unique_ptr<StepRunner>(std::move(runner));
}

absl::StatusOr<std::unique_ptr<StepRunner>> MakeCudaStepRunner(const Model& model, int64_t slots,
                                                               int64_t pages, int64_t page_size,
                                                               int device) {
  return MakeCudaStepRunner(model, slots, pages, page_size, device, CudaRunnerOptions{});
}

const CudaRunnerStats* CudaStats(const StepRunner* runner) {
  const auto* r = dynamic_cast<const CudaStepRunner*>(runner);
  return r ? &r->stats() : nullptr;
}

}  // namespace kimi
