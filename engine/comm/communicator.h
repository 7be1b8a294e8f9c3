// The collectives the sharded engine needs, behind one interface: MPI for CPU tensors
// (mpi_communicator.h), NCCL for GPU tensors (nccl_communicator.h), and a single-rank identity.
// The engine calls only this interface.
//
// Errors are values: a collective that cannot complete in time (a peer died or hangs) returns
// DeadlineExceeded naming the operation and this rank, instead of blocking forever; the caller
// ends the job with that message.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace kimi {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = sum over ranks of data[i]. Every rank gets the same result (the reduction
  // order does not depend on timing).
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
  // out [size() * count]: rank r's `in` at out + r * count.
  virtual absl::Status AllGather(const float* in, int64_t count, float* out) = 0;
  // send holds send_counts[r] floats for rank r, back to back; recv receives recv_counts[r] from
  // rank r, back to back.
  virtual absl::Status AllToAllV(const float* send, const std::vector<int64_t>& send_counts,
                                 float* recv, const std::vector<int64_t>& recv_counts) = 0;
  virtual absl::Status Send(const void* data, int64_t bytes, int peer, int tag) = 0;
  virtual absl::Status Recv(void* data, int64_t bytes, int peer, int tag) = 0;
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;
};

// One rank: collectives are identities.
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(float*, int64_t) override { return absl::OkStatus(); }
  absl::Status AllGather(const float* in, int64_t count, float* out) override;
  absl::Status AllToAllV(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                         const std::vector<int64_t>& recv_counts) override;
  absl::Status Send(const void*, int64_t, int, int) override;
  absl::Status Recv(void*, int64_t, int, int) override;
  absl::Status Broadcast(void*, int64_t, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace kimi
