// Prometheus metrics of kimi-server (names prefixed kimi_), served by prometheus-cpp on their own
// port. Request-level metrics are observed by the gRPC layer; engine and pool metrics arrive once
// per step from the engine loop. All methods are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "scheduler/engine_loop.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace kimi::server {

class Metrics {
 public:
  // Starts the HTTP exposer on `listen` (host:port). Throws nothing; failure is a status.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen,
                                                        const std::string& model_name);
  ~Metrics();

  void OnStep(const sched::StepStats& step, const sched::SchedulerStats& stats);
  // A step of the server's own warm-up request: the pools, and its counts (prefix-cache queries,
  // preemptions) taken as the baseline rather than counted as the clients'.
  void OnWarmUpStep(const sched::SchedulerStats& stats);
  void OnFirstToken(double ttft_seconds, double queue_seconds);
  void OnToken(double inter_token_seconds);
  void OnFinished(sched::FinishReason reason, int64_t prompt_tokens, int64_t completion_tokens,
                  double e2e_seconds);
  void OnCancelled(const std::string& reason);  // client_cancel, deadline, shutdown
  void OnRejected(const std::string& code);    // grpc status name
  void OnAuthFailure();
  void SetPools(const sched::SchedulerStats& stats);

  // Text of the current scrape (what /metrics serves), for tests and logs.
  std::string Scrape() const;
  int port() const;

 private:
  Metrics();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimi::server
