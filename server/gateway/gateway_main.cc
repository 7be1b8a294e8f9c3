// kimi-gateway: the OpenAI-compatible HTTP API (chat completions, completions, models, health) in
// front of a kimi-server, translated to kimi.v1 gRPC calls. Start-up: parse flags, bind the HTTP
// port (port 0: a free one) and log it, then serve until SIGTERM/SIGINT; on a signal, waiting
// requests and open streams are cancelled on the backend and the process exits 0.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "proto/client_credentials.h"
#include "server/gateway/flags.h"
#include "server/gateway/gateway.h"
#include "server/gateway/routes.h"
#include "server/gateway/task_queue.h"
#include <signal.h>
#include <sys/socket.h>

namespace kimi::gateway {
namespace {

// The first key in a file (one per line, '#' comments), as an authorization value.
absl::StatusOr<std::string> ReadBackendKey(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--backend-api-key-file: cannot open ", path));
  std::string line;
  while (std::getline(in, line)) {
    const std::string key(absl::StripAsciiWhitespace(line));
    if (key.empty() || key[0] == '#') continue;
    std::string value = absl::StrCat("Bearer ", key);
    if (absl::Status s = CheckMetadataValue(value); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend-api-key-file: the key in ", path, " ", s.message()));
    }
    return value;
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend-api-key-file: ", path, " has no key"));
}

// cpp-httplib listens with a backlog of 5 (built into Debian's library): a burst of new clients
// would overflow it, and each connection refused that way waits a second for TCP to retry. Linux
// takes a second listen() on a listening socket as a new backlog.
class HttpServer : public httplib::Server {
 public:
  bool RaiseBacklog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

void ConfigureHttp(httplib::Server& server, const GatewayFlags& flags) {
  const size_t max_threads = static_cast<size_t>(flags.max_connections);
  server.new_task_queue = [max_threads] { return new ElasticTaskQueue(max_threads); };
  server.set_tcp_nodelay(true);           // each SSE chunk leaves at once
  server.set_keep_alive_max_count(1000);  // requests per connection
  server.set_write_timeout(30);           // a client that reads nothing for 30 s is dropped
  server.set_payload_max_length(kMaxBodyBytes);
  // httplib's default sets SO_REUSEPORT, with which a second gateway could listen on a port in
  // use and take half its connections: SO_REUSEADDR alone still allows a restart over
  // connections in TIME_WAIT.
  server.set_socket_options([](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

// After SIGTERM/SIGINT: /health and new requests answer 503 while the open ones finish, for at most
// `timeout_s` (a second signal, or the HTTP server ending, cuts it short). What is still open
// afterwards is cancelled on the backend when the caller sets `stopping`.
// Returns true when a second signal cut the drain short.
bool Drain(Gateway& g, const sigset_t& signals, int sig, int64_t timeout_s,
           const std::atomic<bool>& http_done) {
  g.draining = true;
  spdlog::info("{}: draining {} open requests (at most {} s; a second signal stops at once)",
               strsignal(sig), g.open_requests.load(), timeout_s);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  const timespec poll{0, 50'000'000};
  while (g.open_requests.load() > 0 && !http_done.load() &&
         std::chrono::steady_clock::now() < deadline) {
    if (sigtimedwait(&signals, nullptr, &poll) > 0) {
      spdlog::info("second signal: stopping now");
      return true;
    }
  }
  if (g.open_requests.load() > 0) {
    spdlog::info("stopping; {} open requests are cancelled on the backend", g.open_requests.load());
  }
  return false;
}

// Binds the HTTP port; returns the port (the chosen one for port 0), or an error.
absl::StatusOr<int> Bind(httplib::Server& server, const std::string& listen) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(listen, &host, &port); !s.ok()) return s;
  if (port == 0)
    port = server.bind_to_any_port(host);
  else if (!server.bind_to_port(host, port))
    port = -1;
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (address in use or invalid)"));
  }
  return port;
}

int Run(int argc, char** argv) {
  bool help = false;
  auto flags = ParseFlags(argc, argv, &help);
  if (help) {
    std::fputs(HelpText().c_str(), stdout);
    return 0;
  }
  if (!flags.ok()) {
    std::fprintf(stderr, "kimi-gateway: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(flags->log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  // Signals go to one waiting thread; block them before any thread starts. Writes to a closed
  // socket must fail with EPIPE, not kill the process.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto keys = server::ApiKeys::Load(flags->api_keys_file);
  if (!keys.ok()) {
    spdlog::error("--api-keys-file: {}", std::string(keys.status().message()));
    return 2;
  }
  std::string backend_authorization;
  if (!flags->backend_api_key_file.empty()) {
    auto key = ReadBackendKey(flags->backend_api_key_file);
    if (!key.ok()) {
      spdlog::error("{}", std::string(key.status().message()));
      return 2;
    }
    backend_authorization = *key;
  }

  auto credentials = ClientCredentials({{"--backend-ca-file", flags->backend_ca_file},
                                        {"--backend-cert-file", flags->backend_cert_file},
                                        {"--backend-key-file", flags->backend_key_file}});
  if (!credentials.ok()) {
    spdlog::error("{}", std::string(credentials.status().message()));
    return 2;
  }
  BackendClient backend(flags->backend, *credentials);
  ServedModel model(&backend);
  TokenBytes token_bytes(&backend);
  Gateway g;
  g.backend = &backend;
  g.model = &model;
  g.token_bytes = &token_bytes;
  g.request_options.default_max_tokens = static_cast<uint32_t>(flags->default_max_tokens);
  g.request_options.max_choices = static_cast<int>(flags->max_choices);
  g.keys = std::move(*keys);
  g.backend_authorization = backend_authorization;

  HttpServer server;
  ConfigureHttp(server, *flags);
  AddRoutes(server, g);
  auto port = Bind(server, flags->listen);
  if (!port.ok()) {
    spdlog::error("{}", std::string(port.status().message()));
    return 1;
  }
  if (!server.RaiseBacklog(1024)) spdlog::warn("cannot raise the HTTP listen backlog");
  // The resolved port (":0" picks a free one): tests read it from this line.
  const std::string host = flags->listen.substr(0, flags->listen.rfind(':'));
  spdlog::info("HTTP listening on {}:{} (OpenAI API, {} keys), backend {}", host, *port,
               g.keys.enabled() ? "own" : "passthrough", flags->backend);

  std::atomic<bool> http_done{false};
  std::thread http([&] {
    server.listen_after_bind();
    http_done = true;
    if (!g.stopping.load()) kill(getpid(), SIGTERM);  // stopped on its own: shut down
  });
  int sig = 0;
  sigwait(&signals, &sig);
  const bool second_signal = Drain(g, signals, sig, flags->drain_timeout_seconds, http_done);
  g.stopping = true;
  // The requests still open end with an error within a poll of the event queue (100 ms); stopping
  // the HTTP server first would cut them off (httplib calls no content provider once it is
  // stopping). A client too slow to take its last bytes is not waited for past a second, and a
  // second signal stops at once.
  for (int i = 0; i < 50 && !second_signal && g.open_requests.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  while (!http_done.load()) {  // stop() is a no-op until the accept loop runs: repeat it
    server.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  http.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace kimi::gateway

int main(int argc, char** argv) { return kimi::gateway::Run(argc, argv); }
