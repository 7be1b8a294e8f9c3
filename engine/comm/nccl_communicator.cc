#include "engine/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <thread>

#include "absl/strings/str_cat.h"

namespace kimi {

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float, for Barrier
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    MpiCommunicator& bootstrap, int device, std::chrono::seconds timeout) {
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaSetDevice(", device, ") failed"));
  }
  ncclUniqueId id;
  if (bootstrap.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
    return absl::UnavailableError("ncclGetUniqueId failed");
  }
  if (absl::Status s = bootstrap.Broadcast(&id, sizeof id, 0); !s.ok()) return s;
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator);
  c->impl_ = std::make_unique<Impl>();
  c->rank_ = bootstrap.rank();
  c->size_ = bootstrap.size();
  c->timeout_ = timeout;
  if (ncclCommInitRank(&c->impl_->comm, c->size_, id, c->rank_) != ncclSuccess) {
    return absl::UnavailableError("ncclCommInitRank failed");
  }
  if (cudaStreamCreateWithFlags(&c->impl_->stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(&c->impl_->scratch, sizeof(float)) != cudaSuccess) {
    return absl::UnavailableError("cannot create the NCCL stream");
  }
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
  if (impl_->scratch) cudaFree(impl_->scratch);
}

// Waits for the stream, watching NCCL's asynchronous error and the deadline.
absl::Status NcclCommunicator::Finish(int result, const char* what) {
  if (result != ncclSuccess) {
    return absl::InternalError(absl::StrCat("rank ", rank_, ": nccl ", what, ": ",
                                            ncclGetErrorString(static_cast<ncclResult_t>(result))));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    const cudaError_t q = cudaStreamQuery(impl_->stream);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) {
      return absl::InternalError(absl::StrCat("rank ", rank_, ": ", what, ": ",
                                              cudaGetErrorString(q)));
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, ": nccl ", what, " did not complete in ", timeout_.count(),
          " s (a peer rank died or hangs)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t count) {
  return Finish(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum,
                              impl_->comm, impl_->stream),
                "all_reduce");
}

absl::Status NcclCommunicator::AllGather(const float* in, int64_t count, float* out) {
  return Finish(ncclAllGather(in, out, static_cast<size_t>(count), ncclFloat32, impl_->comm,
                              impl_->stream),
                "all_gather");
}

absl::Status NcclCommunicator::AllToAllV(const float* send,
                                         const std::vector<int64_t>& send_counts, float* recv,
                                         const std::vector<int64_t>& recv_counts) {
  if (static_cast<int>(send_counts.size()) != size_ ||
      static_cast<int>(recv_counts.size()) != size_) {
    return absl::InvalidArgumentError("AllToAllV: one count per rank");
  }
  ncclGroupStart();
  int64_t s_off = 0, r_off = 0;
  for (int r = 0; r < size_; ++r) {
    ncclSend(send + s_off, static_cast<size_t>(send_counts[r]), ncclFloat32, r, impl_->comm,
             impl_->stream);
    ncclRecv(recv + r_off, static_cast<size_t>(recv_counts[r]), ncclFloat32, r, impl_->comm,
             impl_->stream);
    s_off += send_counts[r];
    r_off += recv_counts[r];
  }
  return Finish(ncclGroupEnd(), "all_to_all_v");
}

absl::Status NcclCommunicator::Send(const void* data, int64_t bytes, int peer, int /*tag*/) {
  return Finish(ncclSend(data, static_cast<size_t>(bytes), ncclUint8, peer, impl_->comm,
                         impl_->stream),
                "send");
}

absl::Status NcclCommunicator::Recv(void* data, int64_t bytes, int peer, int /*tag*/) {
  return Finish(ncclRecv(data, static_cast<size_t>(bytes), ncclUint8, peer, impl_->comm,
                         impl_->stream),
                "recv");
}

absl::Status NcclCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  return Finish(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, impl_->comm,
                              impl_->stream),
                "broadcast");
}

absl::Status NcclCommunicator::Barrier() {
  return Finish(ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclFloat32, ncclSum,
                              impl_->comm, impl_->stream),
                "barrier");
}

}  // namespace kimi
