// TLS material of kimi-server (tls.cert_file, tls.key_file, tls.client_ca_file), read and checked
// at start-up with OpenSSL's libcrypto. gRPC reports a bad certificate or key only as a failure to
// listen, which names neither the file nor what is wrong with it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/config.h"

namespace kimi::server {

struct TlsMaterial {
  std::string cert_chain;   // PEM: the server certificate, then any intermediates
  std::string private_key;  // PEM
  std::string client_ca;    // PEM; empty: no mutual TLS
  // Where each came from, for messages (may be empty).
  std::string cert_file, key_file, client_ca_file;
};

// Reads the files the config names (nothing when TLS is off). Errors name the key and the path.
absl::StatusOr<TlsMaterial> ReadTlsFiles(const ServerConfig& config);

// Parses the chain, the key and the client CA and checks that the key belongs to the first
// certificate. Errors name the key (tls.cert_file, tls.key_file, tls.client_ca_file) and what is
// wrong. A server certificate outside its validity dates is not an error (clocks differ, and a
// client may not check), but gets a line in `warnings`.
absl::Status CheckTlsMaterial(const TlsMaterial& tls, std::vector<std::string>* warnings);

}  // namespace kimi::server
