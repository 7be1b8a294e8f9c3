// kimi-gateway's command line:
//   kimi-gateway --backend 127.0.0.1:PORT [--listen 127.0.0.1:PORT] [--api-keys-file FILE]
//                [--backend-api-key-file FILE] [--backend-ca-file FILE [--backend-cert-file FILE
//                --backend-key-file FILE]] [--max-connections N] [--default-max-tokens N]
//                [--max-choices N] [--drain-timeout-seconds N] [--log-level LEVEL]
// `--flag value` and `--flag=value` both work.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kimi::gateway {

struct GatewayFlags {
  std::string backend = "127.0.0.1:50051";
  std::string listen = "127.0.0.1:8000";  // port 0: a free one, printed at start-up
  std::string api_keys_file;              // the gateway's own keys; unset: pass keys through
  std::string backend_api_key_file;       // with --api-keys-file: the key to send to the backend
  // TLS to the backend (a kimi-server with tls.* set): the CA that signed its certificate, and for
  // mutual TLS (tls.client_ca_file) the gateway's own certificate and key. No CA: plaintext.
  std::string backend_ca_file, backend_cert_file, backend_key_file;
  int64_t max_connections = 1024;         // concurrent HTTP connections served (one thread each)
  int64_t default_max_tokens = 4096;      // chat requests without max_tokens (server limit)
  int64_t max_choices = 128;              // n x prompts per request
  int64_t drain_timeout_seconds = 30;     // on SIGTERM: how long open requests may finish
  std::string log_level = "info";
};

// Parses argv. `help` is set for --help (the caller prints HelpText()).
absl::StatusOr<GatewayFlags> ParseFlags(int argc, const char* const* argv, bool* help);
std::string HelpText();

// "host:port" or "[v6]:port" -> host (brackets removed) and port.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace kimi::gateway
