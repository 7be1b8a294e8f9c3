// The gateway's side of the wire: one gRPC channel to kimi-server, shared by every HTTP request
// (gRPC multiplexes the streams over it; each stream reads independently, so a slow HTTP client
// never holds up another). Generate runs on gRPC's callback API: messages land in an EventQueue
// that the HTTP thread drains, and Cancel() (ClientContext::TryCancel) ends a stream on the server
// within a scheduler step. Unary calls (model info, detokenize, health) are blocking, with
// deadlines.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kimi/v1/generation.grpc.pb.h"

namespace kimi::gateway {

// What a Generate stream delivers: messages, then its end.
struct StreamEvent {
  int choice = 0;
  bool end = false;
  v1::GenerateResponse message;  // when !end
  grpc::Status status;           // when end
};

// The events of the streams behind one HTTP request, in arrival order. Thread-safe.
class EventQueue {
 public:
  void Push(StreamEvent e);
  // The next event, waiting up to `timeout`; nullopt if none came.
  std::optional<StreamEvent> Pop(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
};

// One Generate stream. Owns itself until gRPC is done with it, so a caller may drop it at any time.
class GenerateCall {
 public:
  virtual ~GenerateCall() = default;
  // Ends the stream now (a no-op once it has ended); the server frees its state within a step.
  virtual void Cancel() = 0;
};

class BackendClient {
 public:
  // `target`: host:port of kimi-server; `credentials`: plaintext or TLS (ClientCredentials).
  BackendClient(const std::string& target, std::shared_ptr<grpc::ChannelCredentials> credentials);
  // Waits (up to 5 s) for streams still in flight to wind down.
  ~BackendClient();

  // `authorization`: the metadata value to send ("Bearer KEY"), or empty for none.
  std::shared_ptr<GenerateCall> Generate(const v1::GenerateRequest& request,
                                         const std::string& authorization, int choice,
                                         std::shared_ptr<EventQueue> events);
  absl::StatusOr<v1::ModelInfo> GetModelInfo(const std::string& authorization);
  absl::StatusOr<v1::DetokenizeResponse> Detokenize(const v1::DetokenizeRequest& request,
                                                    const std::string& authorization);
  // grpc.health.v1 Check of the whole server: true when SERVING.
  absl::StatusOr<bool> Serving();

  // Bookkeeping for streams in flight (used by the calls themselves).
  void StreamStarted();
  void StreamEnded();

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t streams_ = 0;
};

}  // namespace kimi::gateway
