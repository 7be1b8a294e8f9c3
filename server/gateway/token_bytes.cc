#include "server/gateway/token_bytes.h"

namespace kimi::gateway {

TokenPiece TokenBytes::Get(const std::string& model, uint32_t id,
                           const std::string& authorization) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (model != model_) {
      pieces_.clear();
      model_ = model;
    }
    auto it = pieces_.find(id);
    if (it != pieces_.end()) return it->second;
  }
  auto detok = backend_->Detokenize({id}, /*skip_special_tokens=*/true, authorization);
  if (!detok.ok()) return {};
  // With special tokens skipped a token's text is empty only when text leaves it out (a partial
  // character is U+FFFD). A server from before `raw` sends only the text; one from before
  // skip_special_tokens sends every token's text.
  TokenPiece piece;
  piece.in_text = !detok->text().empty();
  piece.bytes = detok->raw().empty() ? detok->text() : detok->raw();
  std::lock_guard<std::mutex> lock(mu_);
  if (model == model_) pieces_.emplace(id, piece);
  return piece;
}

}  // namespace kimi::gateway
