#include "server/gateway/token_bytes.h"

#include <algorithm>
#include <optional>

namespace kimi::gateway {

// Caller holds mu_.
void TokenBytes::UseModel(const std::string& model) {
  if (model == model_) return;
  pieces_.clear();
  model_ = model;
}

std::optional<TokenPiece> TokenBytes::Cached(const std::string& model, uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  UseModel(model);
  auto it = pieces_.find(id);
  if (it == pieces_.end()) return std::nullopt;
  return it->second;
}

TokenPiece TokenBytes::Get(const std::string& model, uint32_t id,
                           const std::string& authorization) {
  if (auto piece = Cached(model, id)) return *piece;
  Prefetch(model, {id}, authorization);
  if (auto piece = Cached(model, id)) return *piece;
  // A server from before each_token. With special tokens skipped a token's text is empty only
  // when text leaves it out (a partial character is U+FFFD); one from before skip_special_tokens
  // sends every token's text, one from before `raw` only the text. Not cached: rare.
  v1::DetokenizeRequest request;
  request.add_token_ids(id);
  request.set_skip_special_tokens(true);
  auto detok = backend_->Detokenize(request, authorization);
  if (!detok.ok()) return {};
  return {detok->raw().empty() ? detok->text() : detok->raw(), !detok->text().empty()};
}

void TokenBytes::Prefetch(const std::string& model, const std::vector<uint32_t>& ids,
                          const std::string& authorization) {
  v1::DetokenizeRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    UseModel(model);
    for (uint32_t id : ids) {
      // A token often recurs among its own alternatives: ask for each id once.
      if (pieces_.count(id) == 0 &&
          std::find(request.token_ids().begin(), request.token_ids().end(), id) ==
              request.token_ids().end()) {
        request.add_token_ids(id);
      }
    }
  }
  if (request.token_ids_size() == 0) return;
  request.set_each_token(true);
  auto detok = backend_->Detokenize(request, authorization);
  // An error, or a server without each_token: Get asks id by id.
  if (!detok.ok() || detok->tokens_size() != request.token_ids_size()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (model != model_) return;
  for (int i = 0; i < request.token_ids_size(); ++i) {
    pieces_.emplace(request.token_ids(i),
                    TokenPiece{detok->tokens(i).raw(), !detok->tokens(i).special()});
  }
}

}  // namespace kimi::gateway
