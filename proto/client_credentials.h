// The channel credentials of a kimi.v1 client (kimi-gateway, kimi-loadtest): plaintext, or TLS
// from PEM files named by the client's flags: the CA that signed the server's certificate, and for
// a server that asks for one (tls.client_ca_file) the client's own certificate and key.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"

namespace kimi {

struct ClientTlsFile {
  std::string flag;  // how the client's user names it, for messages
  std::string path;  // empty: not given
};

struct ClientTlsFiles {
  ClientTlsFile ca, cert, key;
};

// Insecure credentials when no CA file is given, else TLS. A file that cannot be read or holds no
// PEM block is an error naming its flag (gRPC would only fail each connection, naming neither).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const ClientTlsFiles& files);

}  // namespace kimi
