#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kimi::server {
namespace {

std::array<unsigned char, 32> Digest(const std::string& s) {
  std::array<unsigned char, 32> d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  ApiKeys keys;
  if (path.empty()) return keys;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("auth.api_keys_file: cannot open ", path));
  std::string line;
  while (std::getline(in, line)) {
    const std::string key(absl::StripAsciiWhitespace(line));
    if (key.empty() || key[0] == '#') continue;
    keys.digests_.push_back(Digest(key));
  }
  if (keys.digests_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("auth.api_keys_file: ", path, " has no keys"));
  }
  return keys;
}

absl::Status ApiKeys::Check(const std::string& authorization) const {
  if (!enabled()) return absl::OkStatus();
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "missing API key: send 'authorization: Bearer <key>' (an HTTP header through the "
        "gateway, gRPC metadata otherwise)");
  }
  // "Bearer <key>"; the scheme's case does not matter (RFC 7235), the key's does.
  constexpr absl::string_view kBearer = "bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return absl::UnauthenticatedError(
        "authorization: expected 'Bearer <key>' (the Bearer scheme, a space, then the key)");
  }
  const auto d = Digest(std::string(
      absl::StripLeadingAsciiWhitespace(absl::string_view(authorization).substr(kBearer.size()))));
  int match = 0;
  for (const auto& k : digests_) match |= CRYPTO_memcmp(d.data(), k.data(), d.size()) == 0;
  if (!match) return absl::UnauthenticatedError("invalid API key");
  return absl::OkStatus();
}

}  // namespace kimi::server
