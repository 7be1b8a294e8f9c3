#include "server/config.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/model_config.h"
#include "yaml-cpp/yaml.h"

namespace kimi::server {
namespace {

using Member = std::variant<std::string ServerConfig::*, int64_t ServerConfig::*,
                            double ServerConfig::*, bool ServerConfig::*>;

// Every setting once: YAML key (section.key), a short flag if it has one, help.
struct Setting {
  const char* key;
  const char* flag;  // "" : only --section.key
  Member member;
  const char* help;
};

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> kSettings = {
      {"model.path", "--model", &ServerConfig::model_path, "checkpoint directory (required)"},
      {"model.name", "", &ServerConfig::model_name, "served model name (default: directory name)"},
      {"model.activation_dtype", "--activation-dtype", &ServerConfig::activation_dtype,
       "fp32, or bf16 (matmul inputs rounded to bf16: faster prefill, looser accuracy)"},
      {"model.kda_state_dtype", "--kda-state-dtype", &ServerConfig::kda_state_dtype,
       "fp32, or bf16 (KDA states kept in bf16: half their memory, looser accuracy; CPU only)"},
      {"model.device", "--device", &ServerConfig::device,
       "cpu, or cuda / cuda:N (one GPU, one process; builds with nvcc only)"},
      {"model.threads", "--threads", &ServerConfig::threads,
       "engine threads; 0 = one per CPU this process may use (affinity mask, cgroup CPU quota)"},
      {"model.max_context", "--max-context", &ServerConfig::max_context,
       "tokens per request (prompt + output); 0 = the model's limit"},
      {"server.listen", "--listen", &ServerConfig::listen, "gRPC address host:port"},
      {"server.metrics_listen", "--metrics-listen", &ServerConfig::metrics_listen,
       "Prometheus /metrics address host:port"},
      {"server.max_request_bytes", "", &ServerConfig::max_request_bytes,
       "largest accepted request message"},
      {"server.drain_timeout_seconds", "", &ServerConfig::drain_timeout_seconds,
       "on SIGTERM/SIGINT, how long running streams may finish"},
      {"parallel.tp", "--tp", &ServerConfig::tp, "tensor-parallel ranks"},
      {"parallel.ep", "--ep", &ServerConfig::ep, "expert-parallel ranks"},
      {"parallel.pp", "--pp", &ServerConfig::pp, "pipeline-parallel stages"},
      {"parallel.stage_layers", "", &ServerConfig::stage_layers,
       "layers per pipeline stage, comma-separated (default: as even as possible)"},
      {"parallel.collective_timeout_seconds", "", &ServerConfig::collective_timeout_seconds,
       "a collective or pipeline transfer waiting longer ends the job (a rank died or hangs)"},
      {"parallel.replicate_threshold", "", &ServerConfig::replicate_threshold,
       "expert parallel: replicate hot experts when a rank holds more than this times the mean "
       "load of a step (0 = never)"},
      {"parallel.max_replicated_experts", "", &ServerConfig::max_replicated_experts,
       "expert parallel: replicas per MoE layer and step at most"},
      {"memory.kda_state_mib", "", &ServerConfig::kda_state_mib,
       "memory for per-request KDA state slots"},
      {"memory.kv_cache_mib", "", &ServerConfig::kv_cache_mib, "memory for MLA KV pages"},
      {"memory.prefix_cache_mib", "", &ServerConfig::prefix_cache_mib,
       "memory for prefix-cache KDA snapshots (0 disables the cache)"},
      {"batching.max_running", "", &ServerConfig::max_running,
       "requests decoding at once (upper bound on KDA slots)"},
      {"batching.token_budget", "", &ServerConfig::token_budget,
       "tokens per step (prefill chunks + decodes); also sizes the AttnRes cache"},
      {"batching.max_waiting", "", &ServerConfig::max_waiting,
       "requests waiting beyond those the free slots start next; more get RESOURCE_EXHAUSTED"},
      {"batching.page_size", "", &ServerConfig::page_size, "positions per MLA KV page"},
      {"batching.prefix_interval", "", &ServerConfig::prefix_interval,
       "tokens between prefix-cache snapshots (multiple of 64 and of page_size; 0: no prefix "
       "cache)"},
      {"batching.preemption", "", &ServerConfig::preemption,
       "when memory runs out: swap (KDA state and pages to host) or recompute"},
      {"limits.max_tokens", "", &ServerConfig::max_tokens, "largest max_tokens a request may ask"},
      {"limits.max_stop_strings", "", &ServerConfig::max_stop_strings, "stop strings per request"},
      {"limits.max_stop_string_bytes", "", &ServerConfig::max_stop_string_bytes,
       "bytes per stop string"},
      {"limits.max_logprobs", "", &ServerConfig::max_logprobs, "largest logprobs (top-n)"},
      {"auth.api_keys_file", "--api-keys-file", &ServerConfig::api_keys_file,
       "file with one API key per line; set: requests need 'authorization: Bearer KEY'"},
      {"tls.cert_file", "--tls-cert", &ServerConfig::tls_cert_file, "server certificate (PEM)"},
      {"tls.key_file", "--tls-key", &ServerConfig::tls_key_file, "server private key (PEM)"},
      {"tls.client_ca_file", "--tls-client-ca", &ServerConfig::tls_client_ca_file,
       "CA for client certificates (PEM); set: mutual TLS"},
      {"logging.level", "--log-level", &ServerConfig::log_level, "trace, debug, info, warn, error"},
      {"logging.log_prompts", "", &ServerConfig::log_prompts,
       "include prompt text in request logs"},
  };
  return kSettings;
}

const Setting* FindKey(absl::string_view key) {
  for (const Setting& s : Settings()) {
    if (key == s.key) return &s;
  }
  return nullptr;
}

// True when some key lives under `section.`.
bool IsSection(absl::string_view section) {
  for (const Setting& s : Settings()) {
    if (absl::StartsWith(s.key, absl::StrCat(section, "."))) return true;
  }
  return false;
}

const Setting* FindFlag(absl::string_view flag) {
  for (const Setting& s : Settings()) {
    if ((*s.flag && flag == s.flag) || flag == absl::StrCat("--", s.key)) return &s;
  }
  return nullptr;
}

// Sets one setting from text (flags) with type checking.
absl::Status SetFromText(const Setting& s, const std::string& text, const std::string& where,
                         ServerConfig* c) {
  auto bad = [&](const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected ", want, " for ", s.key, ", got \"", text, "\""));
  };
  return std::visit(
      [&](auto member) -> absl::Status {
        using T = std::remove_cvref_t<decltype(c->*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          c->*member = text;
        } else if constexpr (std::is_same_v<T, int64_t>) {
          int64_t v;
          if (!absl::SimpleAtoi(text, &v)) return bad("an integer");
          c->*member = v;
        } else if constexpr (std::is_same_v<T, double>) {
          double v;
          if (!absl::SimpleAtod(text, &v) || !std::isfinite(v)) return bad("a number");
          c->*member = v;
        } else {
          if (text == "true" || text == "1") {
            c->*member = true;
          } else if (text == "false" || text == "0") {
            c->*member = false;
          } else {
            return bad("true or false");
          }
        }
        return absl::OkStatus();
      },
      s.member);
}

std::string ValueText(const Setting& s, const ServerConfig& c) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_cvref_t<decltype(c.*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return absl::StrCat("\"", c.*member, "\"");
        } else if constexpr (std::is_same_v<T, bool>) {
          return c.*member ? "true" : "false";
        } else {
          return absl::StrCat(c.*member);
        }
      },
      s.member);
}

bool ValidAddress(const std::string& a) {
  const size_t colon = a.rfind(':');
  int port;
  return colon != std::string::npos && colon > 0 &&
         absl::SimpleAtoi(a.substr(colon + 1), &port) && port >= 0 && port <= 65535;
}

#ifdef KIMI_HAVE_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

}  // namespace

int CudaOrdinal(const std::string& device) {
  if (device == "cuda") return 0;
  int n;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &n) && n >= 0) {
    return n;
  }
  return -1;
}

absl::Status ApplyYaml(const std::string& yaml_text, const std::string& source,
                       ServerConfig* config) {
  YAML::Node root;
  try {  // yaml-cpp reports errors by exception; they stop here
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) return absl::InvalidArgumentError(source + ": expected a mapping of sections");
  // yaml-cpp keeps every entry of a mapping, a key given twice included, and the loop below would
  // let the last one win without a word: a duplicated key (or section) is most likely an edit
  // that went wrong, so it is refused, named.
  std::set<std::string> seen;
  auto twice = [&](const std::string& key) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": given twice"));
  };
  for (const auto& section : root) {
    const std::string name = section.first.as<std::string>("");
    if (!seen.insert(name).second) return twice(name);
    // "server:" with nothing under it sets nothing.
    if (section.second.IsNull() && IsSection(name)) continue;
    if (!section.second.IsMap()) {
      return absl::InvalidArgumentError(
          IsSection(name) ? absl::StrCat(source, ": section \"", name, "\" must hold keys (", name,
                                         ".KEY: VALUE, indented under it)")
                          : absl::StrCat(source, ": unknown section \"", name,
                                         "\" (kimi-server --help lists the keys)"));
    }
    for (const auto& kv : section.second) {
      const std::string key = absl::StrCat(name, ".", kv.first.as<std::string>(""));
      if (!seen.insert(key).second) return twice(key);
      const Setting* s = FindKey(key);
      if (!s) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": unknown key \"", key, "\" (kimi-server --help lists them)"));
      }
      if (!kv.second.IsScalar()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, " must be a scalar"));
      }
      if (absl::Status st = SetFromText(*s, kv.second.Scalar(), source, config); !st.ok()) {
        return st;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerConfig> ParseCommandLine(int argc, char** argv, bool* help) {
  *help = false;
  ServerConfig c;
  // Pass 1: --config and --help; pass 2: the flags, which override the file.
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_path;
  auto unknown = [](const std::string& flag) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown flag ", flag, " (kimi-server --help lists them)"));
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return c;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\""));
    }
    std::string value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (i + 1 >= argc) {
        if (arg != "--config" && FindFlag(arg) == nullptr) return unknown(arg);
        return absl::InvalidArgumentError(absl::StrCat(arg, " needs a value"));
      }
      value = argv[++i];
    }
    if (arg == "--config") {
      config_path = value;
    } else {
      flags.emplace_back(arg, value);
    }
  }
  if (!config_path.empty()) {
    std::ifstream in(config_path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", config_path));
    std::stringstream ss;
    ss << in.rdbuf();
    if (absl::Status s = ApplyYaml(ss.str(), config_path, &c); !s.ok()) return s;
  }
  for (const auto& [flag, value] : flags) {
    const Setting* s = FindFlag(flag);
    if (!s) return unknown(flag);
    if (absl::Status st = SetFromText(*s, value, "flag " + flag, &c); !st.ok()) return st;
  }
  if (c.model_name.empty() && !c.model_path.empty()) {
    std::string p = c.model_path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    c.model_name = p.substr(p.find_last_of('/') + 1);
  }
  return c;
}

absl::Status Validate(const ServerConfig& c) {
  auto bad = [](const std::string& key, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", what));
  };
  if (c.model_path.empty()) return bad("model.path", "required (--model DIR)");
  if (c.activation_dtype != "fp32" && c.activation_dtype != "bf16") {
    return bad("model.activation_dtype",
               absl::StrCat("\"", c.activation_dtype, "\": expected fp32 or bf16"));
  }
  if (KdaStateDtype dtype; !ParseKdaStateDtype(c.kda_state_dtype, &dtype)) {
    return bad("model.kda_state_dtype",
               absl::StrCat("\"", c.kda_state_dtype, "\": expected fp32 or bf16"));
  }
  // Every number has an upper bound too, chosen so that nothing downstream overflows or asks
  // for the impossible: a value that passes here must start the server or fail cleanly. MiB
  // sizes are multiplied by 2^20 into int64 bytes (2^30 MiB, 1 PiB, leaves 2^13 of headroom);
  // timeouts become steady_clock deadlines in nanoseconds; gRPC takes the message limit as an
  // int; threads are started at once; token counts size per-step buffers (AttnRes cache bytes =
  // token_budget x bytes per token) and cross 32-bit request fields; tp/ep/pp multiply into an int
  // world size.
  struct Range {
    const char* key;
    int64_t value, lo, hi;
    const char* why = "";
  };
  constexpr int64_t kMaxMib = int64_t{1} << 30;
  constexpr int64_t kMaxTokens = int64_t{1} << 24;
  constexpr int64_t kMaxSeconds = 86400;
  const Range ranges[] = {
      {"model.threads", c.threads, 0, 1024},
      {"model.max_context", c.max_context, 0, kMaxTokens},
      {"server.max_request_bytes", c.max_request_bytes, 1024, std::numeric_limits<int>::max()},
      {"parallel.tp", c.tp, 1, 1024},
      {"parallel.ep", c.ep, 1, 1024},
      {"parallel.pp", c.pp, 1, 1024},
      // Rank 0's idle heartbeat comes every third of it, at best every half second (the engine
      // loop's idle wake): 3 s leaves a follower two chances.
      {"parallel.collective_timeout_seconds", c.collective_timeout_seconds, 3, kMaxSeconds},
      {"parallel.max_replicated_experts", c.max_replicated_experts, 0, 1 << 16},
      {"memory.kda_state_mib", c.kda_state_mib, 1, kMaxMib},
      {"memory.kv_cache_mib", c.kv_cache_mib, 1, kMaxMib},
      {"memory.prefix_cache_mib", c.prefix_cache_mib, 0, kMaxMib},
      {"batching.max_running", c.max_running, 1, 1 << 20},
      {"batching.token_budget", c.token_budget, 64, 1 << 20, " (at least one KDA chunk)"},
      {"batching.max_waiting", c.max_waiting, 1, 1 << 20},
      {"batching.page_size", c.page_size, 1, 1024},
      {"batching.prefix_interval", c.prefix_interval, 0, kMaxTokens},
      {"limits.max_tokens", c.max_tokens, 1, kMaxTokens},
      {"limits.max_stop_strings", c.max_stop_strings, 0, 1024},
      {"limits.max_stop_string_bytes", c.max_stop_string_bytes, 1, 1 << 20},
      {"limits.max_logprobs", c.max_logprobs, 0, 1024},
  };
  for (const Range& r : ranges) {
    if (r.value < r.lo || r.value > r.hi) {
      return bad(r.key,
                 absl::StrCat("must be in [", r.lo, ", ", r.hi, "]", r.why, ", got ", r.value));
    }
  }
  if (c.device != "cpu") {
    if (CudaOrdinal(c.device) < 0) {
      return bad("model.device", absl::StrCat("\"", c.device, "\": expected cpu, cuda or cuda:N"));
    }
    if (!kBuiltWithCuda) {
      return bad("model.device", "this kimi-server was built without CUDA (nvcc was not found)");
    }
    if (c.tp * c.ep * c.pp > 1) {
      return bad("model.device", "cuda serves one GPU in one process (parallel.tp/ep/pp must be 1)");
    }
    if (c.kda_state_dtype != "fp32") {
      return bad("model.kda_state_dtype", "bf16 runs on the CPU engine only (model.device cpu)");
    }
  }
  if (!ValidAddress(c.listen)) return bad("server.listen", "expected host:port");
  if (!ValidAddress(c.metrics_listen)) return bad("server.metrics_listen", "expected host:port");
  if (c.drain_timeout_seconds < 0 || c.drain_timeout_seconds > kMaxSeconds) {
    return bad("server.drain_timeout_seconds",
               absl::StrCat("must be in [0, ", kMaxSeconds, "], got ", c.drain_timeout_seconds));
  }
  if (c.replicate_threshold < 0) return bad("parallel.replicate_threshold", "must be >= 0");
  if (c.prefix_interval < 0 || c.prefix_interval % 64 != 0 ||
      (c.prefix_interval > 0 && c.prefix_interval % c.page_size != 0)) {
    return bad("batching.prefix_interval",
               "must be 0 or a multiple of 64 and of batching.page_size");
  }
  // A step's decodes take one token each: a budget they can use up to within a KDA chunk left a
  // prompt 0 tokens a step (chunks end on the 64-token grid) until the decodes finished.
  if (c.token_budget < c.max_running + 64) {
    return bad("batching.token_budget",
               absl::StrCat("must be at least batching.max_running + 64 (", c.max_running + 64,
                            "), so that a step of decodes leaves a KDA chunk for prompts; got ",
                            c.token_budget));
  }
  if (c.preemption != "swap" && c.preemption != "recompute") {
    return bad("batching.preemption", "must be swap or recompute");
  }
  if (c.tls_cert_file.empty() != c.tls_key_file.empty()) {
    return bad("tls", "cert_file and key_file go together");
  }
  if (!c.tls_client_ca_file.empty() && c.tls_cert_file.empty()) {
    return bad("tls.client_ca_file", "mutual TLS needs tls.cert_file and tls.key_file");
  }
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error"};
  bool level_ok = false;
  for (const char* l : kLevels) level_ok |= c.log_level == l;
  if (!level_ok) return bad("logging.level", "must be trace, debug, info, warn or error");
  return absl::OkStatus();
}

std::string HelpText() {
  std::string out =
      "kimi-server: streaming gRPC inference for Kimi Linear and Kimi K3 checkpoints.\n\n"
      "usage: kimi-server --model DIR [--config FILE] [--listen 127.0.0.1:PORT]\n"
      "                   [--metrics-listen 127.0.0.1:PORT] [flags]\n\n"
      "Every setting is a key of the YAML config file (--config FILE) and a flag; flags override\n"
      "the file. Each key can be given as --section.key VALUE; common ones have short flags.\n"
      "--print-example-config prints a complete YAML file with every default;\n"
      "--check-config validates the file and flags and exits.\n\n";
  const ServerConfig defaults;
  std::string section;
  for (const Setting& s : Settings()) {
    const std::string key = s.key;
    const std::string sec = key.substr(0, key.find('.'));
    if (sec != section) {
      absl::StrAppend(&out, sec, ":\n");
      section = sec;
    }
    std::string flags = absl::StrCat("--", key);
    if (*s.flag) flags = absl::StrCat(s.flag, ", ", flags);
    absl::StrAppend(&out, "  ", key.substr(key.find('.') + 1), "  (", flags,
                    ", default ", ValueText(s, defaults), ")\n      ", s.help, "\n");
  }
  absl::StrAppend(&out,
                  "\nSignals: SIGTERM/SIGINT stop accepting, report NOT_SERVING, let running "
                  "streams finish\nfor server.drain_timeout_seconds, then exit 0. A second "
                  "signal cancels the streams\nstill running at once; a signal before SERVING "
                  "stops at once (exit 0).\n");
  return out;
}

std::string ExampleYaml() {
  std::string out =
      "# kimi-server configuration: every key with its default (model.path has none: it names\n"
      "# an example). Flags override keys (kimi-server --help). Generated from server/config.cc;\n"
      "# kept in sync by a test.\n";
  const ServerConfig defaults;
  std::string section;
  for (const Setting& s : Settings()) {
    const std::string key = s.key;
    const std::string sec = key.substr(0, key.find('.'));
    if (sec != section) {
      absl::StrAppend(&out, "\n", sec, ":\n");
      section = sec;
    }
    std::string value = ValueText(s, defaults);
    // The one key without a default. The name stays empty (the directory's): a copy of this file
    // with only the path changed must not serve another model under this one's name.
    if (key == "model.path") value = "\"models/k3-tiny\"";
    absl::StrAppend(&out, "  # ", s.help, "\n  ", key.substr(key.find('.') + 1), ": ", value,
                    "\n");
  }
  return out;
}

}  // namespace kimi::server
