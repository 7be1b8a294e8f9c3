#include "server/config.h"

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/cleanup/cleanup.h"
#include "gtest/gtest.h"
#include "server/tls.h"
#include <unistd.h>

namespace kimi::server {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(Config, UnknownAndMistypedKeysAreNamed) {
  ServerConfig c;
  absl::Status s = ApplyYaml("server:\n  lisen: 1.2.3.4:5\n", "c.yaml", &c);
  EXPECT_NE(Message(s).find("unknown key \"server.lisen\""), std::string::npos) << s;
  s = ApplyYaml("bogus:\n  x: 1\n", "c.yaml", &c);
  EXPECT_NE(Message(s).find("bogus.x"), std::string::npos) << s;
  s = ApplyYaml("batching:\n  token_budget: lots\n", "c.yaml", &c);
  EXPECT_NE(Message(s).find("batching.token_budget"), std::string::npos) << s;
  s = ApplyYaml("logging:\n  log_prompts: maybe\n", "c.yaml", &c);
  EXPECT_NE(Message(s).find("logging.log_prompts"), std::string::npos) << s;
  s = ApplyYaml("server: [1, 2]\n", "c.yaml", &c);
  EXPECT_EQ(Message(s),
            "c.yaml: section \"server\" must hold keys (server.KEY: VALUE, indented under it)");
  s = ApplyYaml("bogus: 1\n", "c.yaml", &c);
  EXPECT_EQ(Message(s), "c.yaml: unknown section \"bogus\" (kimi-server --help lists the keys)");
  // A known section with nothing under it (all keys commented out) sets nothing.
  EXPECT_TRUE(ApplyYaml("server:\nbatching:\n  max_running: 3\n", "c.yaml", &c).ok());
  EXPECT_EQ(c.max_running, 3);
  s = ApplyYaml("server:\n  listen: [1]\n", "c.yaml", &c);
  EXPECT_NE(Message(s).find("server.listen must be a scalar"), std::string::npos) << s;
  s = ApplyYaml("{unclosed", "c.yaml", &c);
  EXPECT_NE(Message(s).find("not valid YAML"), std::string::npos) << s;
}

TEST(Config, FlagsOverrideTheFile) {
  const std::string path =
      ::testing::TempDir() + "/kimi-config-" + std::to_string(::getpid()) + ".yaml";
  const absl::Cleanup remove = [&] { std::remove(path.c_str()); };
  std::ofstream(path) << "model:\n  path: /m/k3\nbatching:\n  token_budget: 1024\n"
                         "server:\n  listen: 127.0.0.1:6000\n";
  const char* argv[] = {"kimi-server", "--config", path.c_str(), "--listen", "127.0.0.1:7000",
                        "--batching.max_running=3"};
  bool help = false;
  auto c = ParseCommandLine(6, const_cast<char**>(argv), &help);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_path, "/m/k3");
  EXPECT_EQ(c->model_name, "k3");
  EXPECT_EQ(c->token_budget, 1024);
  EXPECT_EQ(c->listen, "127.0.0.1:7000");
  EXPECT_EQ(c->max_running, 3);
  EXPECT_TRUE(Validate(*c).ok()) << Validate(*c);

  const char* bad[] = {"kimi-server", "--model", "/m", "--no-such-flag", "1"};
  auto e = ParseCommandLine(5, const_cast<char**>(bad), &help);
  EXPECT_NE(Message(e.status()).find("unknown flag --no-such-flag"), std::string::npos);
  // Given last, without a value: still named unknown; a known flag there lacks its value.
  const char* last[] = {"kimi-server", "--no-such-flag"};
  e = ParseCommandLine(2, const_cast<char**>(last), &help);
  EXPECT_NE(Message(e.status()).find("unknown flag --no-such-flag"), std::string::npos);
  const char* bare[] = {"kimi-server", "--model"};
  e = ParseCommandLine(2, const_cast<char**>(bare), &help);
  EXPECT_NE(Message(e.status()).find("--model needs a value"), std::string::npos);
  const char* h[] = {"kimi-server", "--help"};
  ASSERT_TRUE(ParseCommandLine(2, const_cast<char**>(h), &help).ok());
  EXPECT_TRUE(help);
  EXPECT_NE(HelpText().find("--metrics-listen"), std::string::npos);
  EXPECT_NE(HelpText().find("batching.prefix_interval"), std::string::npos);
}

TEST(Config, ValidationNamesTheKey) {
  ServerConfig c;
  c.model_path = "/m";
  EXPECT_TRUE(Validate(c).ok());
  auto key_of = [](ServerConfig x) { return Message(Validate(x)); };
  ServerConfig x = c;
  x.listen = "nowhere";
  EXPECT_NE(key_of(x).find("server.listen"), std::string::npos);
  x = c;
  x.prefix_interval = 100;
  EXPECT_NE(key_of(x).find("batching.prefix_interval"), std::string::npos);
  x = c;
  x.preemption = "drop";
  EXPECT_NE(key_of(x).find("batching.preemption"), std::string::npos);
  x = c;
  x.tls_cert_file = "a.pem";
  EXPECT_NE(key_of(x).find("tls"), std::string::npos);
  x = c;
  x.activation_dtype = "fp8";
  EXPECT_NE(key_of(x).find("model.activation_dtype"), std::string::npos);
  x.activation_dtype = "bf16";
  EXPECT_TRUE(Validate(x).ok());
  x = c;
  x.kda_state_dtype = "fp16";
  EXPECT_NE(key_of(x).find("model.kda_state_dtype"), std::string::npos);
  x.kda_state_dtype = "bf16";
  EXPECT_TRUE(Validate(x).ok());
  x.device = "cuda";  // the GPU engine keeps an fp32 state (a build without nvcc: no GPU at all)
#ifdef KIMI_HAVE_CUDA
  EXPECT_NE(key_of(x).find("model.kda_state_dtype"), std::string::npos) << key_of(x);
#else
  EXPECT_NE(key_of(x).find("model.device"), std::string::npos) << key_of(x);
#endif
  x = c;
  x.model_path.clear();
  EXPECT_NE(key_of(x).find("model.path"), std::string::npos);
  // Below 3 s the idle heartbeat (every half second at best) leaves a follower no margin: a 1 s
  // deadline ended an idle job.
  x = c;
  x.collective_timeout_seconds = 2;
  EXPECT_NE(key_of(x).find("parallel.collective_timeout_seconds"), std::string::npos);
  x.collective_timeout_seconds = 3;
  EXPECT_TRUE(Validate(x).ok());
  // A step of decodes must leave a KDA chunk of budget: 256 requests in a budget of 256 left a
  // prompt no token until they finished.
  x = c;
  x.max_running = 256;
  x.token_budget = 256;
  EXPECT_NE(key_of(x).find("batching.token_budget: must be at least batching.max_running + 64"),
            std::string::npos)
      << key_of(x);
  x.token_budget = 320;
  EXPECT_TRUE(Validate(x).ok());
}

// Values that once passed validation and then crashed or wrapped downstream: --threads 100000
// (std::system_error), a max_request_bytes beyond an int (gRPC took 4294968320 as 1024), a drain
// timeout whose milliseconds overflowed, MiB sizes whose bytes overflowed (1 page, 1 slot), a
// token budget whose AttnRes cache size went negative.
TEST(Config, EveryNumberHasAnUpperBound) {
  ServerConfig c;
  c.model_path = "/m";
  constexpr int64_t kMax = INT64_MAX;
  const std::vector<std::pair<const char*, std::function<void(ServerConfig&)>>> too_big = {
      {"model.threads", [](ServerConfig& x) { x.threads = 100000; }},
      {"model.max_context", [](ServerConfig& x) { x.max_context = kMax; }},
      {"server.max_request_bytes", [](ServerConfig& x) { x.max_request_bytes = 4294968320; }},
      {"server.max_request_bytes", [](ServerConfig& x) { x.max_request_bytes = 3000000000; }},
      {"server.drain_timeout_seconds", [](ServerConfig& x) { x.drain_timeout_seconds = 1e10; }},
      {"parallel.tp", [](ServerConfig& x) { x.tp = kMax; }},
      {"parallel.ep", [](ServerConfig& x) { x.ep = int64_t{1} << 40; }},
      {"parallel.pp", [](ServerConfig& x) { x.pp = 100000; }},
      {"parallel.collective_timeout_seconds",
       [](ServerConfig& x) { x.collective_timeout_seconds = kMax; }},
      {"parallel.max_replicated_experts", [](ServerConfig& x) { x.max_replicated_experts = kMax; }},
      {"memory.kda_state_mib", [](ServerConfig& x) { x.kda_state_mib = kMax; }},
      {"memory.kv_cache_mib", [](ServerConfig& x) { x.kv_cache_mib = kMax; }},
      {"memory.prefix_cache_mib", [](ServerConfig& x) { x.prefix_cache_mib = kMax; }},
      {"batching.max_running", [](ServerConfig& x) { x.max_running = kMax; }},
      {"batching.token_budget", [](ServerConfig& x) { x.token_budget = kMax; }},
      {"batching.max_waiting", [](ServerConfig& x) { x.max_waiting = kMax; }},
      {"batching.prefix_interval", [](ServerConfig& x) { x.prefix_interval = int64_t{1} << 40; }},
      {"limits.max_tokens", [](ServerConfig& x) { x.max_tokens = int64_t{1} << 32; }},
      {"limits.max_stop_strings", [](ServerConfig& x) { x.max_stop_strings = kMax; }},
      {"limits.max_stop_string_bytes", [](ServerConfig& x) { x.max_stop_string_bytes = kMax; }},
      {"limits.max_logprobs", [](ServerConfig& x) { x.max_logprobs = int64_t{1} << 32; }},
  };
  for (const auto& [key, set] : too_big) {
    ServerConfig x = c;
    set(x);
    const std::string m = Message(Validate(x));
    EXPECT_EQ(m.rfind(std::string(key) + ": must be in [", 0), 0u) << key << ": " << m;
  }
  // The bounds themselves are accepted.
  ServerConfig x = c;
  x.threads = 1024;
  x.max_request_bytes = INT_MAX;
  x.drain_timeout_seconds = 86400;
  x.kda_state_mib = x.kv_cache_mib = x.prefix_cache_mib = int64_t{1} << 30;
  x.token_budget = x.max_waiting = int64_t{1} << 20;
  x.max_running = x.token_budget - 64;
  EXPECT_TRUE(Validate(x).ok()) << Validate(x);
  EXPECT_EQ(Message(Validate([&] {
              ServerConfig y = c;
              y.threads = 1025;
              return y;
            }())),
            "model.threads: must be in [0, 1024], got 1025");
}

// yaml-cpp keeps both entries of a key given twice; the last silently won.
TEST(Config, KeysGivenTwiceAreRefused) {
  ServerConfig c;
  absl::Status s = ApplyYaml("batching: {max_running: 4, max_running: 7}\n", "c.yaml", &c);
  EXPECT_EQ(Message(s), "c.yaml: batching.max_running: given twice");
  s = ApplyYaml("batching:\n  max_running: 4\n  token_budget: 128\n  max_running: 7\n", "c.yaml",
                &c);
  EXPECT_EQ(Message(s), "c.yaml: batching.max_running: given twice");
  s = ApplyYaml(
      "batching:\n  max_running: 4\nserver:\n  listen: 127.0.0.1:1\nbatching:\n"
      "  token_budget: 128\n",
      "c.yaml", &c);
  EXPECT_EQ(Message(s), "c.yaml: batching: given twice");
  // The same key in two sections is two keys.
  EXPECT_TRUE(ApplyYaml("model:\n  path: /m\nauth:\n  api_keys_file: \"\"\n", "c.yaml", &c).ok());
}

// TLS material made by openssl at test time, checked as kimi-server checks it at start-up.
class ConfigTls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
    dir_ = ::testing::TempDir() + "/kimi-tls-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    const std::string cmd =
        "cd " + dir_ +
        " && for n in a b; do openssl req -x509 -newkey rsa:2048 -nodes -keyout $n.key -out "
        "$n.pem -days 2 -subj /CN=$n || exit 1; done"
        " && openssl req -newkey rsa:2048 -nodes -keyout old.key -out old.csr -subj /CN=old"
        " && openssl x509 -req -in old.csr -signkey old.key -days -1 -out old.pem";
    ASSERT_EQ(std::system(("(" + cmd + ") > /dev/null 2>&1").c_str()), 0) << cmd;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ + "/" + name);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The check's message ("" when it passes).
  std::string Check(const TlsMaterial& tls) {
    warnings_.clear();
    return Message(CheckTlsMaterial(tls, &warnings_));
  }
  std::string dir_;
  std::vector<std::string> warnings_;
};

TEST_F(ConfigTls, NamesTheFileAndWhatIsWrong) {
  const TlsMaterial good{Read("a.pem"), Read("a.key"), Read("b.pem"), "a.pem", "a.key", "b.pem"};
  EXPECT_EQ(Check(good), "");
  EXPECT_TRUE(warnings_.empty());
  // A chain: the server's certificate first, then others.
  TlsMaterial m = good;
  m.cert_chain += Read("b.pem");
  EXPECT_EQ(Check(m), "");

  m = good;
  m.private_key = "garbage\n";
  EXPECT_EQ(
      Check(m),
      "tls.key_file (a.key): no PEM private key in it (expected -----BEGIN PRIVATE KEY-----)");
  m.private_key = Read("a.key").substr(0, 200) + "\n-----END PRIVATE KEY-----\n";
  EXPECT_NE(Check(m).find("tls.key_file (a.key): the private key does not parse"),
            std::string::npos)
      << Check(m);
  m = good;
  m.cert_chain.clear();
  EXPECT_EQ(
      Check(m),
      "tls.cert_file (a.pem): no PEM certificate in it (expected -----BEGIN CERTIFICATE-----; "
      "the file is empty)");
  m.cert_chain = Read("a.key");  // the files swapped
  EXPECT_NE(Check(m).find("tls.cert_file (a.pem): no PEM certificate"), std::string::npos);
  m.cert_chain = Read("a.pem").substr(0, 120) + "\n-----END CERTIFICATE-----\n";
  EXPECT_NE(Check(m).find("tls.cert_file (a.pem): certificate 1 does not parse"), std::string::npos)
      << Check(m);
  m = good;
  m.private_key = Read("b.key");
  EXPECT_NE(Check(m).find("tls.key_file (a.key): does not belong to the certificate in "
                          "tls.cert_file (a.pem)"),
            std::string::npos)
      << Check(m);
  m = good;
  m.client_ca = "garbage\n";
  EXPECT_NE(Check(m).find("tls.client_ca_file (b.pem): no PEM certificate"), std::string::npos)
      << Check(m);
  m.client_ca.clear();
  EXPECT_NE(Check(m).find("tls.client_ca_file (b.pem): no PEM certificate"), std::string::npos)
      << Check(m);
}

TEST_F(ConfigTls, ExpiredCertificateIsAWarning) {
  const TlsMaterial old{Read("old.pem"), Read("old.key"), "", "old.pem", "old.key", ""};
  EXPECT_EQ(Check(old), "");
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("tls.cert_file (old.pem): the server certificate expired on"),
            std::string::npos)
      << warnings_[0];
}

TEST_F(ConfigTls, ReadingNamesTheKey) {
  ServerConfig c;
  c.tls_cert_file = dir_ + "/a.pem";
  c.tls_key_file = dir_;  // a directory
  EXPECT_EQ(Message(ReadTlsFiles(c).status()),
            "tls.key_file: " + dir_ + " is a directory, not a file");
  c.tls_key_file = dir_ + "/a.key";
  c.tls_client_ca_file = dir_ + "/missing.pem";
  EXPECT_EQ(Message(ReadTlsFiles(c).status()),
            "tls.client_ca_file: cannot open " + dir_ + "/missing.pem");
  c.tls_client_ca_file = dir_ + "/b.pem";
  auto tls = ReadTlsFiles(c);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(Check(*tls), "");
}

TEST(Config, DeviceNamesCpuOrOneGpu) {
  EXPECT_EQ(CudaOrdinal("cuda"), 0);
  EXPECT_EQ(CudaOrdinal("cuda:3"), 3);
  for (const char* bad : {"cpu", "gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA"}) {
    EXPECT_EQ(CudaOrdinal(bad), -1) << bad;
  }
  ServerConfig c;
  c.model_path = "/m";
  c.device = "tpu";
  EXPECT_NE(Message(Validate(c)).find("model.device: \"tpu\""), std::string::npos) << Validate(c);
  c.device = "cuda:1";
#ifdef KIMI_HAVE_CUDA
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  c.tp = 2;  // the multi-GPU path is not wired: a clear refusal, not a wrong answer
  EXPECT_NE(Message(Validate(c)).find("model.device"), std::string::npos) << Validate(c);
#else
  EXPECT_NE(Message(Validate(c)).find("without CUDA"), std::string::npos) << Validate(c);
#endif
}

// deploy/config/example.yaml is complete (every key, its default) and loads.
TEST(Config, ExampleFileIsCompleteAndValid) {
  const char* src = std::getenv("KIMI_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/deploy/config/example.yaml");
  ASSERT_TRUE(in) << "deploy/config/example.yaml missing";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), ExampleYaml()) << "regenerate: build/bin/kimi-server --print-example-config "
                                        "> deploy/config/example.yaml";
  ServerConfig c;
  ASSERT_TRUE(ApplyYaml(ss.str(), "example.yaml", &c).ok());
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

}  // namespace
}  // namespace kimi::server
