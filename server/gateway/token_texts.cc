#include "server/gateway/token_texts.h"

namespace kimi::gateway {

std::string TokenTexts::Get(const std::string& model, uint32_t id,
                            const std::string& authorization) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (model != model_) {
      texts_.clear();
      model_ = model;
    }
    auto it = texts_.find(id);
    if (it != texts_.end()) return it->second;
  }
  auto text = backend_->Detokenize({id}, authorization);
  if (!text.ok()) return std::string();
  std::lock_guard<std::mutex> lock(mu_);
  if (model == model_) texts_.emplace(id, *text);
  return *text;
}

}  // namespace kimi::gateway
