#include "server/gateway/flags.h"

#include <vector>

#include "gtest/gtest.h"

namespace kimi::gateway {
namespace {

absl::StatusOr<GatewayFlags> Parse(std::vector<const char*> args, bool* help = nullptr) {
  args.insert(args.begin(), "kimi-gateway");
  bool h = false;
  auto f = ParseFlags(static_cast<int>(args.size()), args.data(), &h);
  if (help) *help = h;
  return f;
}

TEST(GatewayFlags, DefaultsFollowTheContract) {
  auto f = Parse({});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->listen, "127.0.0.1:8000");
  EXPECT_EQ(f->backend, "127.0.0.1:50051");
  EXPECT_TRUE(f->api_keys_file.empty());
}

TEST(GatewayFlags, ParsesBothForms) {
  auto f = Parse({"--backend", "127.0.0.1:9", "--listen=127.0.0.1:0", "--max-connections", "64"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->backend, "127.0.0.1:9");
  EXPECT_EQ(f->listen, "127.0.0.1:0");
  EXPECT_EQ(f->max_connections, 64);
  bool help = false;
  EXPECT_TRUE(Parse({"--help"}, &help).ok());
  EXPECT_TRUE(help);
}

TEST(GatewayFlags, RejectsBadInput) {
  EXPECT_FALSE(Parse({"--nope", "1"}).ok());
  EXPECT_FALSE(Parse({"--listen", "localhost"}).ok());
  EXPECT_FALSE(Parse({"--backend", "127.0.0.1:0"}).ok());
  EXPECT_FALSE(Parse({"--max-connections", "0"}).ok());
  EXPECT_FALSE(Parse({"--backend"}).ok());
  // Named for what is wrong, with the status a bad argument gets.
  EXPECT_EQ(Parse({"--backend"}).status().message(), "--backend: missing value");
  EXPECT_EQ(Parse({"--nope"}).status().message(), "unknown flag --nope (see --help)");
  EXPECT_EQ(Parse({"--nope", "1"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Parse({"--backend-api-key-file", "k.txt"}).ok());  // needs --api-keys-file
  // TLS to the backend: a client certificate goes with its key, and both with the CA.
  EXPECT_FALSE(Parse({"--backend-ca-file", "ca.pem", "--backend-cert-file", "c.pem"}).ok());
  EXPECT_FALSE(Parse({"--backend-cert-file", "c.pem", "--backend-key-file", "c.key"}).ok());
  EXPECT_TRUE(Parse({"--backend-ca-file", "ca.pem", "--backend-cert-file", "c.pem",
                     "--backend-key-file", "c.key"})
                  .ok());
  // spdlog would take an unknown level as "off" and silence the gateway.
  EXPECT_EQ(Parse({"--log-level", "inof"}).status().message(),
            "--log-level: expected trace, debug, info, warn or error, got 'inof'");
  EXPECT_TRUE(Parse({"--log-level", "warn"}).ok());
}

TEST(GatewayFlags, SplitHostPort) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(SplitHostPort("[::1]:8000", &host, &port).ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 8000);
  ASSERT_TRUE(SplitHostPort("127.0.0.1:0", &host, &port).ok());
  EXPECT_EQ(port, 0);
  EXPECT_FALSE(SplitHostPort("127.0.0.1:70000", &host, &port).ok());
}

}  // namespace
}  // namespace kimi::gateway
