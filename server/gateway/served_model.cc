#include "server/gateway/served_model.h"

#include "server/gateway/errors.h"

namespace kimi::gateway {

absl::StatusOr<v1::ModelInfo> ServedModel::Get(const std::string& authorization, bool fresh) {
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ && !fresh && authorization == authorization_ && now - fetched_ < ttl_) {
      return info_;
    }
  }
  auto info = backend_->GetModelInfo(authorization);
  if (!info.ok()) return info.status();
  std::lock_guard<std::mutex> lock(mu_);
  info_ = *info;
  authorization_ = authorization;
  fetched_ = now;
  cached_ = true;
  return info_;
}

absl::StatusOr<v1::ModelInfo> ServedModel::Check(const std::string& model,
                                                 const std::string& authorization) {
  for (bool fresh : {false, true}) {
    auto info = Get(authorization, fresh);
    if (!info.ok()) return info.status();
    if (info->model_name() == model) return info;
  }
  return ModelNotFound(model);
}

}  // namespace kimi::gateway
