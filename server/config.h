// kimi-server configuration: one YAML file, every key validated, every key also settable on the
// command line (flags win). One table (config.cc) lists each setting once, with its YAML key,
// flag, default and help, so `--help`, the parser and deploy/config/example.yaml agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kimi::server {

struct ServerConfig {
  // model
  std::string model_path;
  std::string model_name;  // served name; default: the model directory's name
  std::string activation_dtype = "fp32";
  std::string kda_state_dtype = "fp32";  // the KDA state pool's recurrent states: fp32 or bf16
  std::string device = "cpu";
  int64_t threads = 0;  // engine threads; 0 = one per usable CPU
  int64_t max_context = 0;  // prompt + output limit; 0 = the model's own
  // server
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";
  int64_t max_request_bytes = 4 << 20;
  double drain_timeout_seconds = 30.0;
  // parallel
  int64_t tp = 1, ep = 1, pp = 1;
  std::string stage_layers;  // "10,10,5": layers per pipeline stage (default: as even as possible)
  int64_t collective_timeout_seconds = 120;
  double replicate_threshold = 1.25;
  int64_t max_replicated_experts = 4;
  // memory
  int64_t kda_state_mib = 1024;
  int64_t kv_cache_mib = 1024;
  int64_t prefix_cache_mib = 256;
  // batching
  int64_t max_running = 32;
  int64_t token_budget = 512;
  int64_t max_waiting = 256;
  int64_t page_size = 16;
  int64_t prefix_interval = 256;
  std::string preemption = "swap";
  // limits
  int64_t max_tokens = 4096;          // largest max_tokens a request may ask for
  int64_t max_stop_strings = 8;
  int64_t max_stop_string_bytes = 256;
  int64_t max_logprobs = 20;
  // auth
  std::string api_keys_file;
  // tls
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;  // set: clients must present a certificate it signed (mTLS)
  // logging
  std::string log_level = "info";
  bool log_prompts = false;
};

// Parses a YAML document into `config` (keys absent keep their values).
absl::Status ApplyYaml(const std::string& yaml_text, const std::string& source,
                       ServerConfig* config);

// Reads --config FILE (if any) and then every flag. Returns the config, or an error naming the
// key or flag. `help` is set when --help was given (the caller prints HelpText() and exits).
absl::StatusOr<ServerConfig> ParseCommandLine(int argc, char** argv, bool* help);

// The GPU ordinal of a device string ("cuda" -> 0, "cuda:N" -> N), or -1 when it names no GPU.
int CudaOrdinal(const std::string& device);

// Range and consistency checks of a complete config.
absl::Status Validate(const ServerConfig& config);

std::string HelpText();

// The documented example: every key with its default (deploy/config/example.yaml is this text).
std::string ExampleYaml();

}  // namespace kimi::server
