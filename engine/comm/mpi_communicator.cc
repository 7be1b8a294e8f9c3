#include "engine/comm/mpi_communicator.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"

namespace kimi {

struct MpiCommunicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  std::string peers;  // the other members as world ranks, for error messages
};

MpiCommunicator::MpiCommunicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  MPI_Comm_rank(impl_->comm, &rank_);
  MPI_Comm_size(impl_->comm, &size_);
  MPI_Group group, world_group;
  MPI_Comm_group(impl_->comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> local(size_), world(size_);
  for (int i = 0; i < size_; ++i) local[i] = i;
  MPI_Group_translate_ranks(group, size_, local.data(), world_group, world.data());
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  for (int i = 0; i < size_; ++i) {
    if (i == rank_) continue;
    absl::StrAppend(&impl_->peers, impl_->peers.empty() ? "" : ", ", world[i]);
  }
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
}

MpiCommunicator::~MpiCommunicator() {
  if (impl_->owned) MPI_Comm_free(&impl_->comm);
}

bool MpiCommunicator::LaunchedWithMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (const char* v = std::getenv(var)) {
      if (std::string(var) != "PMIX_RANK" ? std::atoi(v) > 1 : true) return true;
    }
  }
  return false;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::World(
    std::chrono::seconds timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      return absl::UnavailableError("MPI_Init_thread failed");
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      return absl::UnavailableError("MPI does not support MPI_THREAD_SERIALIZED");
    }
    // Errors come back as codes (turned into statuses), not as an abort inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }
  auto impl = std::make_unique<Impl>();
  impl->comm = MPI_COMM_WORLD;
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(std::move(impl)));
  c->timeout_ = timeout;
  return c;
}

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Split(int color, int key) const {
  auto impl = std::make_unique<Impl>();
  if (MPI_Comm_split(impl_->comm, color, key, &impl->comm) != MPI_SUCCESS) {
    return absl::InternalError("MPI_Comm_split failed");
  }
  MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
  impl->owned = true;
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(std::move(impl)));
  c->timeout_ = timeout_;
  return c;
}

// Polls a request until it completes or the deadline passes. Yields between polls: ranks are
// often oversubscribed on the cores of one machine in tests.
absl::Status MpiCommunicator::Wait(void* request, const char* what, int peer) {
  MPI_Request* req = static_cast<MPI_Request*>(request);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  int spins = 0;
  for (;;) {
    int done = 0;
    if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      return absl::InternalError(absl::StrCat("rank ", world_rank_, ": MPI ", what, " failed"));
    }
    if (done) return absl::OkStatus();
    if (++spins < 200) {
      std::this_thread::yield();
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", world_rank_, ": ", what,
          peer >= 0 ? absl::StrCat(" with rank ", peer)
                    : absl::StrCat(" with ranks ", impl_->peers),
          " did not complete in ", timeout_.count(), " s (a peer rank died or hangs)"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::Status MpiCommunicator::AllReduceSum(float* data, int64_t count) {
  MPI_Request req;
  // MPI_SUM over floats in Open MPI reduces in rank order for a given algorithm and size, and
  // all ranks receive the same bits.
  if (MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, impl_->comm,
                     &req) != MPI_SUCCESS) {
    return absl::InternalError("MPI_Iallreduce failed");
  }
  return Wait(&req, "all_reduce", -1);
}

absl::Status MpiCommunicator::AllGather(const float* in, int64_t count, float* out) {
  MPI_Request req;
  if (MPI_Iallgather(in, static_cast<int>(count), MPI_FLOAT, out, static_cast<int>(count),
                     MPI_FLOAT, impl_->comm, &req) != MPI_SUCCESS) {
    return absl::InternalError("MPI_Iallgather failed");
  }
  return Wait(&req, "all_gather", -1);
}

absl::Status MpiCommunicator::AllToAllV(const float* send, const std::vector<int64_t>& send_counts,
                                        float* recv, const std::vector<int64_t>& recv_counts) {
  if (static_cast<int>(send_counts.size()) != size_ ||
      static_cast<int>(recv_counts.size()) != size_) {
    return absl::InvalidArgumentError("AllToAllV: one count per rank");
  }
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  int s_off = 0, r_off = 0;
  for (int r = 0; r < size_; ++r) {
    sc[r] = static_cast<int>(send_counts[r]);
    rc[r] = static_cast<int>(recv_counts[r]);
    sd[r] = s_off;
    rd[r] = r_off;
    s_off += sc[r];
    r_off += rc[r];
  }
  MPI_Request req;
  if (MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT,
                     impl_->comm, &req) != MPI_SUCCESS) {
    return absl::InternalError("MPI_Ialltoallv failed");
  }
  return Wait(&req, "all_to_all_v", -1);
}

absl::Status MpiCommunicator::Send(const void* data, int64_t bytes, int peer, int tag) {
  MPI_Request req;
  if (MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, impl_->comm, &req) !=
      MPI_SUCCESS) {
    return absl::InternalError("MPI_Isend failed");
  }
  return Wait(&req, "send", peer);
}

absl::Status MpiCommunicator::Recv(void* data, int64_t bytes, int peer, int tag) {
  MPI_Request req;
  if (MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, impl_->comm, &req) !=
      MPI_SUCCESS) {
    return absl::InternalError("MPI_Irecv failed");
  }
  return Wait(&req, "recv", peer);
}

absl::Status MpiCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  MPI_Request req;
  if (MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, impl_->comm, &req) !=
      MPI_SUCCESS) {
    return absl::InternalError("MPI_Ibcast failed");
  }
  return Wait(&req, "broadcast", root);
}

absl::Status MpiCommunicator::Barrier() {
  MPI_Request req;
  if (MPI_Ibarrier(impl_->comm, &req) != MPI_SUCCESS) {
    return absl::InternalError("MPI_Ibarrier failed");
  }
  return Wait(&req, "barrier", -1);
}

void MpiCommunicator::Abort(const std::string& message) {
  std::fprintf(stderr, "kimi: fatal: %s; ending the job\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::abort();  // unreachable: MPI_Abort does not return
}

}  // namespace kimi
