#include "server/gateway/token_bytes.h"

namespace kimi::gateway {

std::string TokenBytes::Get(const std::string& model, uint32_t id,
                            const std::string& authorization) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (model != model_) {
      bytes_.clear();
      model_ = model;
    }
    auto it = bytes_.find(id);
    if (it != bytes_.end()) return it->second;
  }
  auto detok = backend_->Detokenize({id}, authorization);
  if (!detok.ok()) return std::string();
  // A server from before `raw` sends only the text (a split character as U+FFFD).
  std::string bytes = detok->raw().empty() ? detok->text() : detok->raw();
  std::lock_guard<std::mutex> lock(mu_);
  if (model == model_) bytes_.emplace(id, bytes);
  return bytes;
}

}  // namespace kimi::gateway
