#include "engine/expert_jobs.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/pack.h"
#include "kernels/cpu/thread_pool.h"

namespace kimi::layers {
namespace {

// An expert's three matrices, random, in `format` (bf16 or MXFP4), packed as this machine's
// kernels prefer.
struct Expert {
  std::vector<uint16_t> bf16[3];
  std::vector<uint8_t> codes[3], scales[3];
  MlpWeights w;
};

Weight MakeWeight(Expert& e, int which, WeightFormat format, int64_t rows, int64_t cols,
                  std::mt19937& rng) {
  Weight w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  if (format == WeightFormat::kBF16) {
    auto& v = e.bf16[which];
    v.resize(rows * cols);
    // Magnitudes in [2^-5, 2^-4), random signs: sums of a few hundred terms stay near 1.
    for (auto& b : v) b = static_cast<uint16_t>(0x3d00 | (rng() & 0x7f) | ((rng() & 1) << 15));
    w.data = v.data();
  } else {
    auto& c = e.codes[which];
    auto& s = e.scales[which];
    c.resize(rows * cols / 2);
    s.resize(rows * cols / 32);
    for (auto& b : c) b = static_cast<uint8_t>(rng());
    for (auto& b : s) b = static_cast<uint8_t>(118 + rng() % 4);  // 2^-9 .. 2^-6
    w.data = c.data();
    w.scales = s.data();
  }
  cpu::PackInPlace(&w);
  return w;
}

// Experts of hidden width d and intermediate width I (rows not a multiple of the chunks'
// 32-row groups when I % 32 != 0), each given some of the T tokens of src.
struct Layer {
  std::vector<Expert> experts;
  std::vector<float> src, in, out;
  std::vector<std::vector<int64_t>> rows;
  std::vector<ExpertJob> jobs;
};

void Build(Layer& l, WeightFormat format, int64_t d, int64_t I, int64_t T, int E, uint32_t seed) {
  std::mt19937 rng(seed);
  l.experts.resize(E);
  l.rows.resize(E);
  l.src.resize(T * d);
  for (auto& v : l.src) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  int64_t total = 0;
  for (int e = 0; e < E; ++e) {
    Expert& x = l.experts[e];
    x.w.gate = MakeWeight(x, 0, format, I, d, rng);
    x.w.up = MakeWeight(x, 1, format, I, d, rng);
    x.w.down = MakeWeight(x, 2, format, d, I, rng);
    const int64_t n = 1 + e % 4;  // 1-4 tokens an expert: a decode step's
    for (int64_t i = 0; i < n; ++i) l.rows[e].push_back(static_cast<int64_t>(rng() % T));
    total += n;
  }
  l.in.assign(total * d, 0.0f);
  l.out.assign(total * d, 0.0f);
  int64_t at = 0;
  for (int e = 0; e < E; ++e) {
    const int64_t n = static_cast<int64_t>(l.rows[e].size());
    ExpertJob job{&l.experts[e].w, &l.in[at * d], &l.out[at * d], n, JobCost(l.experts[e].w, n)};
    job.src = l.src.data();
    job.rows = l.rows[e].data();
    job.width = d;
    l.jobs.push_back(job);
    at += n;
  }
}

// Every job run through RunExpertJobs, its last one shared by the threads (no minimum size),
// equals the same job run alone on one thread, bit for bit.
void ExpectSharedTailEqualsAlone(const ModelConfig& c, WeightFormat format, int64_t d, int64_t I) {
  if (cpu::ThreadPool::Global().num_threads() < 2) GTEST_SKIP() << "one thread";
  Layer l;
  Build(l, format, d, I, /*T=*/16, /*E=*/9, static_cast<uint32_t>(d * 7 + I));
  for (ExpertJob& j : l.jobs) j.Run(c);
  const std::vector<float> alone = l.out;
  std::fill(l.out.begin(), l.out.end(), 0.0f);
  RunExpertJobs(c, l.jobs, /*shared_tail_min_bytes=*/0);
  ASSERT_EQ(std::memcmp(alone.data(), l.out.data(), alone.size() * sizeof(float)), 0);
  for (float v : l.out) ASSERT_TRUE(std::isfinite(v));
}

TEST(ExpertJobs, SharedTailEqualsAloneBf16) {
  ModelConfig c;
  ExpectSharedTailEqualsAlone(c, WeightFormat::kBF16, 256, 512);
  ExpectSharedTailEqualsAlone(c, WeightFormat::kBF16, 128, 80);  // 80 rows: chunks 32, 32, 16
}

TEST(ExpertJobs, SharedTailEqualsAloneMxfp4Situ) {
  ModelConfig c;
  c.activation = Activation::kSituGlu;
  ExpectSharedTailEqualsAlone(c, WeightFormat::kMxfp4, 256, 256);
}

// With the default minimum the small experts above run whole, with the same results.
TEST(ExpertJobs, SmallExpertsRunWhole) {
  ModelConfig c;
  Layer l;
  Build(l, WeightFormat::kMxfp4, 128, 128, 8, 5, 3);
  for (ExpertJob& j : l.jobs) j.Run(c);
  const std::vector<float> alone = l.out;
  std::fill(l.out.begin(), l.out.end(), 0.0f);
  RunExpertJobs(c, l.jobs);
  EXPECT_EQ(std::memcmp(alone.data(), l.out.data(), alone.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace kimi::layers
