// Token bytes for logprobs: the backend's Detokenize of single ids (its `raw` bytes; special tokens
// as their text), cached per model, since a token's bytes never change while the same model is
// served.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "server/gateway/backend_client.h"

namespace kimi::gateway {

class TokenBytes {
 public:
  explicit TokenBytes(BackendClient* backend) : backend_(backend) {}

  // The bytes of `id` under `model` (a new model name empties the cache); empty if the backend
  // cannot say.
  std::string Get(const std::string& model, uint32_t id, const std::string& authorization);

 private:
  BackendClient* backend_;
  std::mutex mu_;
  std::string model_;
  std::unordered_map<uint32_t, std::string> bytes_;
};

}  // namespace kimi::gateway
