// Communicator over NCCL, for GPU tensors (device pointers). The NCCL unique id is made on rank 0
// and broadcast over MPI. Each operation runs on the communicator's own stream and is waited for
// against a deadline (polling the stream and NCCL's async error), so a dead peer becomes
// DeadlineExceeded and the NCCL communicator is aborted instead of hanging.
#pragma once

#include <chrono>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/comm/mpi_communicator.h"

namespace kimi {

class NcclCommunicator final : public Communicator {
 public:
  // Every rank of `bootstrap` joins; `device` is this rank's CUDA device.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(MpiCommunicator& bootstrap,
                                                                  int device,
                                                                  std::chrono::seconds timeout);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(float* data, int64_t count) override;
  absl::Status AllGather(const float* in, int64_t count, float* out) override;
  absl::Status AllToAllV(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override;
  absl::Status Send(const void* data, int64_t bytes, int peer, int tag) override;
  absl::Status Recv(void* data, int64_t bytes, int peer, int tag) override;
  absl::Status Broadcast(void* data, int64_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  struct Impl;
  NcclCommunicator() = default;
  absl::Status Finish(int result, const char* what);

  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  std::chrono::seconds timeout_{60};
};

}  // namespace kimi
