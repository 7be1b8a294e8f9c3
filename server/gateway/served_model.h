// The backend's model: what GET /v1/models lists and what a request's `model` must name. Asked of
// the backend with the caller's credentials and cached for a few seconds, for those credentials
// only (the backend checks every caller's key: a cached answer given to another key, or none,
// would skip that check); a name that does not match is checked once more against a fresh answer
// before it is refused, so a backend restarted with another model is picked up at once.
#pragma once

#include <chrono>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "server/gateway/backend_client.h"

namespace kimi::gateway {

class ServedModel {
 public:
  explicit ServedModel(BackendClient* backend,
                       std::chrono::milliseconds ttl = std::chrono::seconds(5))
      : backend_(backend), ttl_(ttl) {}

  // The model's info; `fresh` skips the cache.
  absl::StatusOr<v1::ModelInfo> Get(const std::string& authorization, bool fresh = false);
  // The model's info when `model` is the served model's name; NOT_FOUND (model_not_found)
  // otherwise, or the backend's own error (UNAVAILABLE, UNAUTHENTICATED, ...).
  absl::StatusOr<v1::ModelInfo> Check(const std::string& model, const std::string& authorization);

 private:
  BackendClient* backend_;
  std::chrono::milliseconds ttl_;
  std::mutex mu_;
  bool cached_ = false;
  std::string authorization_;  // what info_ was asked with
  v1::ModelInfo info_;
  std::chrono::steady_clock::time_point fetched_;
};

}  // namespace kimi::gateway
