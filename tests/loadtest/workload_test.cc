#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "gtest/gtest.h"
#include "loadtest/stats.h"
#include "loadtest/workload.h"
#include <unistd.h>

namespace kimi::loadtest {
namespace {

TEST(Workload, LengthDistributions) {
  auto f = ParseLengthDist("fixed:7", "x");
  ASSERT_TRUE(f.ok());
  std::mt19937_64 rng(1);
  EXPECT_EQ(f->Draw(rng), 7);
  auto u = ParseLengthDist("uniform:3:5", "x");
  ASSERT_TRUE(u.ok());
  for (int i = 0; i < 100; ++i) {
    const int64_t v = u->Draw(rng);
    EXPECT_GE(v, 3);
    EXPECT_LE(v, 5);
  }
  for (const char* bad : {"fixed:0", "uniform:5:3", "normal:3", "fixed", "uniform:a:b",
                          "fixed:4294967299", "uniform:1:4294967296"}) {
    EXPECT_FALSE(ParseLengthDist(bad, "x").ok()) << bad;
  }
}

// Poisson arrivals: the mean gap is 1/rate (within 5 standard errors over 20000 gaps).
TEST(Workload, PoissonArrivalsHaveTheRate) {
  std::mt19937_64 rng(3);
  const auto t = PoissonArrivals(50.0, 1e9, 20000, rng);
  ASSERT_EQ(t.size(), 20000u);
  const double mean_gap = t.back() / static_cast<double>(t.size());
  EXPECT_NEAR(mean_gap, 0.02, 5 * 0.02 / std::sqrt(20000.0));
  const auto limited = PoissonArrivals(10.0, 2.0, 1000, rng);
  EXPECT_LE(limited.back(), 2.0);
}

TEST(Workload, Jsonl) {
  const std::string path =
      ::testing::TempDir() + "/workload-" + std::to_string(::getpid()) + ".jsonl";
  const absl::Cleanup remove = [&] { std::remove(path.c_str()); };
  std::ofstream(path) << "{\"prompt\": \"hi\", \"max_tokens\": 4}\n\n"
                         "{\"prompt_tokens\": 12, \"output_tokens\": 3}\n";
  auto r = ReadJsonl(path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].prompt_text, "hi");
  EXPECT_EQ((*r)[1].prompt_tokens, 12);
  EXPECT_EQ((*r)[1].max_tokens, 3);
  std::ofstream(path) << "{\"prompt\": 3}\n";
  EXPECT_FALSE(ReadJsonl(path).ok());
  // Sent as is, these failed every request or wrapped on the wire's uint32 (4294967299 -> 3).
  for (const char* bad : {"{\"prompt\": \"\", \"max_tokens\": 3}",
                          "{\"prompt_tokens\": 4, \"max_tokens\": 4294967296}",
                          "{\"prompt_tokens\": 4, \"max_tokens\": 18446744073709551615}",
                          "{\"prompt_tokens\": 4294967296, \"max_tokens\": 3}"}) {
    std::ofstream(path) << bad << "\n";
    EXPECT_FALSE(ReadJsonl(path).ok()) << bad;
  }
  std::ofstream(path) << "{\"prompt_tokens\": 4, \"max_tokens\": 4294967295}\n";
  EXPECT_TRUE(ReadJsonl(path).ok());
}

TEST(Stats, PercentilesAndGoodput) {
  const Percentiles p = Summarise(std::vector<double>{5, 1, 4, 2, 3, 6, 7, 8, 9, 10});
  EXPECT_EQ(p.p50, 5);
  EXPECT_EQ(p.p90, 9);
  EXPECT_EQ(p.p99, 10);
  EXPECT_DOUBLE_EQ(p.mean, 5.5);
  EXPECT_EQ(p.count, 10);
  EXPECT_EQ(Summarise(std::vector<double>{}).count, 0);  // reported as no data, not as 0 s
  std::vector<RequestResult> rs(3);
  rs[0] = {0.0, 0.1, 1.0, {0.1, 0.2, 1.0}, 5, 3, "OK"};   // TPOT 0.45: misses a 0.1 s SLO
  rs[1] = {0.5, 0.2, 0.4, {0.2, 0.3, 0.4}, 5, 3, "OK"};   // TPOT 0.1: meets it
  rs[2] = {0.6, -1, 0.1, {}, 0, 0, "RESOURCE_EXHAUSTED"};
  const LevelSummary s = Summarise(rs, 2.0, 2.0, 1.0, 0.1);
  EXPECT_EQ(s.succeeded, 2);
  EXPECT_EQ(s.errors.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);
  EXPECT_NEAR(s.good_fraction, 1.0 / 3.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.output_tokens_per_s, 3.0);
}

}  // namespace
}  // namespace kimi::loadtest
