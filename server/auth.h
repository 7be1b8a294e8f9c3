// Optional API keys: `authorization: Bearer KEY` metadata checked against keys from a file (one per
// line, '#' comments). Keys are compared as SHA-256 digests in constant time, against every key, so
// neither timing nor length reveals anything about them.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kimi::server {

class ApiKeys {
 public:
  // No file: every request is allowed.
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  bool enabled() const { return !digests_.empty(); }
  // `authorization` is the metadata value (or empty when absent).
  absl::Status Check(const std::string& authorization) const;

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
};

}  // namespace kimi::server
