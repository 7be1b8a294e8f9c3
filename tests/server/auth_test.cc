#include "server/auth.h"

#include <cstdio>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "gtest/gtest.h"
#include <unistd.h>

namespace kimi::server {
namespace {

TEST(ApiKeys, BearerKeysFromFile) {
  auto none = ApiKeys::Load("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());
  EXPECT_TRUE(none->Check("").ok());

  const std::string path =
      ::testing::TempDir() + "/kimi-keys-" + std::to_string(::getpid()) + ".txt";
  const absl::Cleanup remove = [&] { std::remove(path.c_str()); };
  std::ofstream(path) << "# team keys\n\nsk-alpha\n  sk-beta  \n";
  auto keys = ApiKeys::Load(path);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_TRUE(keys->Check("Bearer sk-alpha").ok());
  EXPECT_TRUE(keys->Check("Bearer sk-beta").ok());
  EXPECT_EQ(keys->Check("Bearer sk-gamma").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->Check("sk-alpha").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->Check("").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(keys->Check("Bearer sk-alph").code(), absl::StatusCode::kUnauthenticated);
  // The scheme is case-insensitive (RFC 7235); the key is not.
  EXPECT_TRUE(keys->Check("bearer sk-alpha").ok());
  EXPECT_TRUE(keys->Check("BEARER  sk-beta").ok());
  EXPECT_EQ(keys->Check("Bearer SK-ALPHA").code(), absl::StatusCode::kUnauthenticated);
  // Each failure says what is wrong: nothing sent, no Bearer scheme, or an unknown key.
  EXPECT_EQ(keys->Check("").message(),
            "missing API key: send 'authorization: Bearer <key>' (an HTTP header through the "
            "gateway, gRPC metadata otherwise)");
  EXPECT_EQ(keys->Check("sk-alpha").message(),
            "authorization: expected 'Bearer <key>' (the Bearer scheme, a space, then the key)");
  EXPECT_EQ(keys->Check("Basic c2stYWxwaGE=").message(),
            "authorization: expected 'Bearer <key>' (the Bearer scheme, a space, then the key)");
  EXPECT_EQ(keys->Check("Bearer sk-gamma").message(), "invalid API key");

  std::ofstream(path) << "# nothing\n";
  EXPECT_FALSE(ApiKeys::Load(path).ok());
  EXPECT_FALSE(ApiKeys::Load("/no/such/file").ok());
}

}  // namespace
}  // namespace kimi::server
