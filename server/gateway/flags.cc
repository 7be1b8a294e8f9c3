#include "server/gateway/flags.h"

#include <cstdlib>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kimi::gateway {
namespace {

absl::Status SetInt(const std::string& flag, const std::string& value, int64_t lo, int64_t* out) {
  if (!absl::SimpleAtoi(value, out) || *out < lo) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected an integer >= ", lo, ", got '", value, "'"));
  }
  return absl::OkStatus();
}

absl::Status Set(GatewayFlags* f, const std::string& flag, const std::string& value) {
  if (flag == "--backend") {
    f->backend = value;
  } else if (flag == "--listen") {
    f->listen = value;
  } else if (flag == "--api-keys-file") {
    f->api_keys_file = value;
  } else if (flag == "--backend-api-key-file") {
    f->backend_api_key_file = value;
  } else if (flag == "--backend-ca-file") {
    f->backend_ca_file = value;
  } else if (flag == "--backend-cert-file") {
    f->backend_cert_file = value;
  } else if (flag == "--backend-key-file") {
    f->backend_key_file = value;
  } else if (flag == "--log-level") {
    if (value != "trace" && value != "debug" && value != "info" && value != "warn" &&
        value != "error") {
      // spdlog takes an unknown name as "off", which would silence the gateway.
      return absl::InvalidArgumentError(absl::StrCat(
          "--log-level: expected trace, debug, info, warn or error, got '", value, "'"));
    }
    f->log_level = value;
  } else if (flag == "--max-connections") {
    return SetInt(flag, value, 1, &f->max_connections);
  } else if (flag == "--default-max-tokens") {
    return SetInt(flag, value, 1, &f->default_max_tokens);
  } else if (flag == "--max-choices") {
    return SetInt(flag, value, 1, &f->max_choices);
  } else if (flag == "--drain-timeout-seconds") {
    return SetInt(flag, value, 0, &f->drain_timeout_seconds);
  } else {
    return absl::NotFoundError(absl::StrCat("unknown flag ", flag, " (see --help)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  int64_t p = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 ||
      p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT (port 0: any free port)"));
  }
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = static_cast<int>(p);
  return absl::OkStatus();
}

absl::StatusOr<GatewayFlags> ParseFlags(int argc, const char* const* argv, bool* help) {
  GatewayFlags f;
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      *help = true;
      return f;
    }
    std::string value;
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      // The last argument: an unknown flag is named as such, not as one lacking its value.
      GatewayFlags scratch;
      if (absl::Status s = Set(&scratch, flag, ""); absl::IsNotFound(s)) {
        return absl::InvalidArgumentError(s.message());
      }
      return absl::InvalidArgumentError(absl::StrCat(flag, ": missing value"));
    }
    if (absl::Status s = Set(&f, flag, value); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
  }
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(f.listen, &host, &port); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen: ", std::string(s.message())));
  }
  if (absl::Status s = SplitHostPort(f.backend, &host, &port); !s.ok() || port == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend: '", f.backend, "' is not HOST:PORT of a kimi-server"));
  }
  if (f.backend_cert_file.empty() != f.backend_key_file.empty()) {
    return absl::InvalidArgumentError("--backend-cert-file and --backend-key-file go together");
  }
  if (!f.backend_cert_file.empty() && f.backend_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--backend-cert-file: only with --backend-ca-file (TLS to the backend)");
  }
  if (!f.backend_api_key_file.empty() && f.api_keys_file.empty()) {
    return absl::InvalidArgumentError(
        "--backend-api-key-file: only with --api-keys-file (without it, clients' keys pass "
        "through to the backend)");
  }
  return f;
}

std::string HelpText() {
  return R"(kimi-gateway: OpenAI-compatible HTTP API in front of a kimi-server (gRPC).

  --backend HOST:PORT           kimi-server to call                    [127.0.0.1:50051]
  --listen HOST:PORT            HTTP address; port 0 picks a free one  [127.0.0.1:8000]
  --api-keys-file FILE          the gateway's own API keys, one per line ('#' comments); clients
                                send 'Authorization: Bearer KEY'. Unset: the client's
                                Authorization header is passed to the backend as gRPC metadata
  --backend-api-key-file FILE   with --api-keys-file: the key the gateway sends to the backend
  --backend-ca-file FILE        TLS to the backend (a kimi-server with tls.* set): the CA
                                certificates (PEM) its certificate is checked against;
                                unset: plaintext gRPC
  --backend-cert-file FILE      with --backend-key-file: the gateway's certificate and key
  --backend-key-file FILE       (PEM) for a server that asks for one (tls.client_ca_file)
  --max-connections N           HTTP connections served at once, one thread each       [1024]
  --default-max-tokens N        max_tokens of chat requests that set none (at most the
                                server's limits.max_tokens)                            [4096]
  --max-choices N               largest n x prompts in one request                      [128]
  --drain-timeout-seconds N     on SIGTERM/SIGINT: /health and new requests get 503 while
                                open ones finish, for at most N s; then the rest are
                                cancelled. A second signal stops at once                 [30]
  --log-level LEVEL             trace, debug, info, warn, error                        [info]

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health.
)";
}

}  // namespace kimi::gateway
