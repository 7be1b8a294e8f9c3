// Communicator over MPI (Open MPI from Debian), for CPU tensors. Every operation is non-blocking
// underneath and polled against a deadline, so a dead or hung peer turns into DeadlineExceeded
// naming the operation, instead of a silent hang.
//
// Thread contract: one thread at a time per communicator (MPI_THREAD_SERIALIZED).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"

namespace kimi {

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI (once per process) and wraps MPI_COMM_WORLD.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> World(std::chrono::seconds timeout);
  // Whether this process was started by mpirun with more than one rank.
  static bool LaunchedWithMpi();
  ~MpiCommunicator() override;

  // The ranks with the same `color`, ordered by `key` (MPI_Comm_split).
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> Split(int color, int key) const;

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

  // Ends every rank of the job with `message` (MPI_Abort); for unrecoverable faults.
  [[noreturn]] static void Abort(const std::string& message);

 private:
  struct Impl;
  explicit MpiCommunicator(std::unique_ptr<Impl> impl);
  absl::Status Wait(void* request, const char* what, int peer);

  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  int world_rank_ = 0;
  std::chrono::seconds timeout_;
};

}  // namespace kimi
