#include "engine/comm/communicator.h"

#include <algorithm>

namespace kimi {

absl::Status SingleRankCommunicator::AllGather(const float* in, int64_t count, float* out) {
  std::copy_n(in, count, out);
  return absl::OkStatus();
}

absl::Status SingleRankCommunicator::AllToAllV(const float* send,
                                               const std::vector<int64_t>& send_counts,
                                               float* recv,
                                               const std::vector<int64_t>& recv_counts) {
  if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0]) {
    return absl::InvalidArgumentError("AllToAllV on one rank: counts must match");
  }
  std::copy_n(send, send_counts[0], recv);
  return absl::OkStatus();
}

absl::Status SingleRankCommunicator::Send(const void*, int64_t, int, int) {
  return absl::FailedPreconditionError("Send on a single-rank communicator");
}

absl::Status SingleRankCommunicator::Recv(void*, int64_t, int, int) {
  return absl::FailedPreconditionError("Recv on a single-rank communicator");
}

}  // namespace kimi
