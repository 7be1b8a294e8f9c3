#include "scheduler/sampling.h"

#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <algorithm>

#include "gtest/gtest.h"

namespace kimi::sched {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f}; }

TEST(Sampling, GreedyTakesTheArgmaxAndReportsRawLogprobs) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 3;
  const auto l = Logits();
  const TokenChoice c = SampleToken(l, p, {}, {}, 0);
  EXPECT_EQ(c.token, 1);
  double z = 0.0;
  for (float v : l) z += std::exp(v);
  EXPECT_NEAR(c.logprob, 3.0 - std::log(z), 1e-6);
  ASSERT_EQ(c.top.size(), 3u);
  EXPECT_EQ(c.top[0].first, 1);
  EXPECT_EQ(c.top[1].first, 5);
  EXPECT_EQ(c.top[2].first, 2);
}

// Greedy is the first id of the largest value, NaNs passed over (0 when nothing else is there), on
// rows of every length around the vector width, with ties, -0 beside +0, -inf and NaNs.
TEST(Sampling, GreedyIsTheFirstLargestIdNaNsPassedOver) {
  std::mt19937 rng(23);
  SamplingParams p;
  p.temperature = 0.0f;
  int rows = 0;
  for (size_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 1000, 100512}) {
    for (int kind = 0; kind < 6; ++kind, ++rows) {
      std::vector<float> l(n);
      for (float& v : l) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);
      if (kind == 1) l[rng() % n] = -0.0f;
      if (kind == 2) {
        for (size_t i = 0; i < n; i += 3) l[i] = std::nanf("");
      }
      if (kind == 3) std::fill(l.begin(), l.end(), -INFINITY);
      if (kind == 4) std::fill(l.begin(), l.end(), std::nanf(""));
      if (kind == 5) {
        std::fill(l.begin(), l.end(), std::nanf(""));
        l[n - 1] = -INFINITY;
      }
      int32_t want = -1;
      for (size_t i = 0; i < n; ++i) {
        if (!std::isnan(l[i]) && (want < 0 || l[i] > l[want])) want = static_cast<int32_t>(i);
      }
      if (want < 0) want = 0;
      ASSERT_EQ(SampleToken(l, p, {}, {}, 0).token, want) << "n " << n << " kind " << kind;
    }
  }
  EXPECT_EQ(rows, 11 * 6);
}

// A NaN logit, and inf - inf (a row of -inf, or a +inf logit), exponentiate to NaN: the
// normaliser and the logprobs are NaN, the draw and the alternatives still name ids of the row.
// ExpNonPositive converted the NaN's exponent to int (undefined; UBSan stopped the process at a
// signed overflow), on the draw's path and the logprobs' alike.
TEST(Sampling, NaNAndInfiniteLogitsAreExponentiatedWithoutUndefinedBehaviour) {
  const std::vector<std::vector<float>> rows = {
      {std::nanf(""), 0.0f, 1.0f}, {-INFINITY, -INFINITY, -INFINITY}, {INFINITY, 0.0f, 1.0f}};
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const float t : {0.0f, 1.0f}) {
      for (const int32_t top_k : {0, 2}) {
        SamplingParams p;
        p.temperature = t;
        p.top_k = top_k;
        p.logprobs = 2;
        const TokenChoice c = SampleToken(rows[r], p, {}, {}, 0);
        EXPECT_GE(c.token, 0) << r;
        EXPECT_LT(c.token, 3) << r;
        EXPECT_EQ(c.top.size(), 2u) << r;
      }
    }
  }
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 1;
  EXPECT_TRUE(std::isnan(SampleToken(rows[0], p, {}, {}, 0).logprob));
}

// Draws depend on (seed, index) only; their frequencies follow softmax(l / T).
// A temperature whose reciprocal overflows a float is greedy (it drew [PAD] or noise before).
TEST(Sampling, ATemperatureTooSmallToInvertIsGreedy) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
  for (const float t : {1e-40f, 2e-39f, 1e-45f}) {
    for (const int32_t top_k : {0, 3}) {
      SamplingParams p;
      p.temperature = t;
      p.top_k = top_k;
      for (uint64_t seed = 0; seed < 20; ++seed) {
        p.seed = seed;
        EXPECT_EQ(SampleToken(l, p, {}, {}, seed).token, 1) << t << " " << top_k;
      }
    }
  }
  SamplingParams small;  // still invertible: a draw, and the best token all but surely
  small.temperature = 1e-30f;
  EXPECT_EQ(SampleToken(l, small, {}, {}, 0).token, 1);
}

TEST(Sampling, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  const auto l = Logits();
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t a = SampleToken(l, p, {}, {}, i).token;
    EXPECT_EQ(a, SampleToken(l, p, {}, {}, i).token);
    ++counts[a];
  }
  double z = 0.0;
  for (float v : l) z += std::exp(v / 0.7);
  for (size_t t = 0; t < l.size(); ++t) {
    const double expected = std::exp(l[t] / 0.7) / z;
    const double sd = std::sqrt(expected * (1 - expected) / n);
    EXPECT_NEAR(counts[t] / static_cast<double>(n), expected, 5 * sd + 1e-4) << t;
  }
}

TEST(Sampling, FiltersRestrictTheCandidates) {
  const auto l = Logits();
  SamplingParams p;
  p.seed = 1;
  p.temperature = 1.0f;
  p.top_k = 2;  // {1, 5}
  for (int i = 0; i < 200; ++i) {
    const int32_t t = SampleToken(l, p, {}, {}, i).token;
    EXPECT_TRUE(t == 1 || t == 5) << t;
  }
  p.top_k = 0;
  p.top_p = 0.01f;  // only the best
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleToken(l, p, {}, {}, i).token, 1);
  p.top_p = 1.0f;
  p.min_p = 0.6f;  // e^(2.9-3)=0.90 and e^(2.5-3)=0.61 pass; e^(1-3)=0.14 does not
  for (int i = 0; i < 300; ++i) {
    const int32_t t = SampleToken(l, p, {}, {}, i).token;
    EXPECT_TRUE(t == 1 || t == 5 || t == 2) << t;
  }
}

TEST(Sampling, PenaltiesDiscourageRepeats) {
  const auto l = Logits();
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 1.0f;  // 3 - 1 < 2.9
  const std::vector<int32_t> out = {1};
  EXPECT_EQ(SampleToken(l, p, {}, out, 0).token, 5);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.06f;  // 3 - 2*0.06 = 2.88 < 2.9
  const std::vector<int32_t> twice = {1, 1};
  EXPECT_EQ(SampleToken(l, p, {}, twice, 0).token, 5);
  p.frequency_penalty = 0.0f;
  p.repetition_penalty = 1.1f;  // prompt tokens too: 3 / 1.1 = 2.73 < 2.9
  const std::vector<int32_t> prompt = {1};
  EXPECT_EQ(SampleToken(l, p, prompt, {}, 0).token, 5);
}

TEST(Sampling, LargeVocabularyTopP) {
  std::vector<float> l(100000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(i * 0.37) * 2.0);
  SamplingParams p;
  p.seed = 3;
  p.top_p = 0.999f;  // needs more than the first 1024 sorted candidates
  p.min_p = 0.001f;
  const TokenChoice c = SampleToken(l, p, {}, {}, 7);
  EXPECT_GE(c.token, 0);
  EXPECT_EQ(c.token, SampleToken(l, p, {}, {}, 7).token);
}

// The next row named to SampleToken is a prefetch hint: every kind of draw (unfiltered, top-p
// over the whole row, top-k, greedy), with and without logprobs and alternatives, gives the same
// choice with it as without, whether the next row is longer, shorter, empty or the row itself.
TEST(Sampling, TheNextRowChangesNothing) {
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(50000), longer(70000), shorter(333), empty;
  for (auto* v : {&row, &longer, &shorter}) {
    for (float& x : *v) x = normal(rng);
  }
  for (int kind = 0; kind < 4; ++kind) {
    for (const bool logprobs : {false, true}) {
      SamplingParams p;
      p.seed = 5;
      if (kind == 0) p.temperature = 0.0f;
      if (kind == 2) p.top_p = 0.9f;
      if (kind == 3) p.top_k = 40;
      p.want_logprobs = logprobs;
      p.logprobs = logprobs ? 5 : 0;
      for (uint64_t index = 0; index < 20; ++index) {
        const TokenChoice want = SampleToken(row, p, {}, {}, index);
        for (const auto* next : {&longer, &shorter, &empty, &row}) {
          const TokenChoice got = SampleToken(row, p, {}, {}, index, *next);
          ASSERT_EQ(got.token, want.token) << kind << " " << index;
          ASSERT_EQ(got.logprob, want.logprob) << kind << " " << index;
          ASSERT_EQ(got.top, want.top) << kind << " " << index;
        }
      }
    }
  }
}

// Penalties change the draw, not what is reported: the logprob and the alternatives are the raw
// row's (the alternatives from its own run maxima, not the penalised row's: the row is long enough
// for TopIds to use them).
TEST(Sampling, PenalisedDrawsReportTheRawRowsLogprobs) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(i * 0.37));
  l[700] = 6.0f;  // the raw best, penalised below every other token
  l[300] = 5.0f;
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 10.0f;
  p.logprobs = 2;
  const std::vector<int32_t> out = {700};
  const TokenChoice c = SampleToken(l, p, {}, out, 0);
  EXPECT_EQ(c.token, 300);
  double z = 0.0;
  for (float v : l) z += std::exp(v - 6.0);
  const double lse = 6.0 + std::log(z);
  EXPECT_NEAR(c.logprob, 5.0 - lse, 1e-6);
  ASSERT_EQ(c.top.size(), 2u);
  EXPECT_EQ(c.top[0].first, 700);
  EXPECT_NEAR(c.top[0].second, 6.0 - lse, 1e-6);
  EXPECT_EQ(c.top[1].first, 300);
}

// The sampler against its definition, written plainly: every probability in double from libm's
// exp, the whole vocabulary sorted, filters applied in order. Rows of 100k logits with a realistic
// spread. Draws must agree exactly (a draw can only differ where u lands within the float exps'
// rounding of a cumulative boundary: about 1.4e-4 of unfiltered draws on rows like these, measured
// over 120k; the 600 here are seeded, so the test is deterministic); logprobs within 1e-5 (float
// logits minus a normaliser whose fast exp is within a few ulp).
struct Reference {
  std::vector<double> logprob;
  std::vector<double> w;  // unnormalised probability by id (0 where filtered out)
  std::vector<int32_t> walk;  // candidates in draw order
};
Reference Define(const std::vector<float>& l, const SamplingParams& p) {
  const size_t V = l.size();
  double mx = -1e300;
  for (float v : l) mx = std::max(mx, static_cast<double>(v));
  double z = 0.0;
  for (float v : l) z += std::exp(v - mx);
  Reference r;
  for (float v : l) r.logprob.push_back(v - mx - std::log(z));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  auto weight = [&](int32_t id) { return std::exp((l[id] - mx) / p.temperature); };
  size_t n = p.top_k > 0 ? std::min<size_t>(V, p.top_k) : V;
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += weight(order[i]);
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    size_t m = 0;
    while (m < n) {
      mass += weight(order[m++]) / total;
      if (mass >= p.top_p) break;
    }
    n = m;
  }
  if (p.min_p > 0.0f) {
    size_t m = 1;
    while (m < n && weight(order[m]) >= p.min_p * weight(order[0])) ++m;
    n = m;
  }
  r.w.assign(V, 0.0);
  for (size_t i = 0; i < n; ++i) r.w[order[i]] = weight(order[i]);
  const bool filtered = p.top_k > 0 || p.top_p < 1.0f || p.min_p > 0.0f;
  if (filtered) {
    r.walk.assign(order.begin(), order.begin() + n);  // best first
  } else {
    r.walk = order;
    std::sort(r.walk.begin(), r.walk.end());  // ids in order
  }
  return r;
}
int32_t DrawFrom(const Reference& r, double u) {
  double mass = 0.0;
  for (int32_t id : r.walk) mass += r.w[id];
  double acc = 0.0;
  for (int32_t id : r.walk) {
    acc += r.w[id];
    if (u * mass < acc) return id;
  }
  return r.walk.back();
}

TEST(Sampling, MatchesTheDefinitionOnALargeVocabulary) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(100000);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  const Case cases[] = {{1.0f, 0, 1.0f, 0.0f},  {0.8f, 40, 0.95f, 0.0f}, {0.7f, 0, 0.9f, 0.0f},
                        {1.2f, 2000, 1.0f, 0.0f}, {1.0f, 0, 1.0f, 0.05f}, {0.6f, 50, 0.8f, 0.02f}};
  int draws = 0;
  for (int row = 0; row < 4; ++row) {
    for (float& v : l) v = normal(rng);
    for (int i = 0; i < 8; ++i) l[rng() % l.size()] += 12.0f;  // a few likely tokens
    for (const Case& c : cases) {
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_k = c.top_k;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      p.want_logprobs = true;
      p.logprobs = 5;
      const Reference want = Define(l, p);
      for (int d = 0; d < 25; ++d, ++draws) {
        p.seed = static_cast<uint64_t>(row * 1000 + d);
        const TokenChoice got = SampleToken(l, p, {}, {}, d);
        ASSERT_EQ(got.token, DrawFrom(want, UniformAt(p.seed, d)))
            << "row " << row << " T " << c.temperature << " draw " << d;
        EXPECT_NEAR(got.logprob, want.logprob[got.token], 1e-5);
        ASSERT_EQ(got.top.size(), 5u);
        for (const auto& [id, lp] : got.top) EXPECT_NEAR(lp, want.logprob[id], 1e-5);
        for (size_t k = 1; k < got.top.size(); ++k) EXPECT_GE(got.top[k - 1].second, got.top[k].second);
      }
    }
  }
  EXPECT_EQ(draws, 4 * 6 * 25);
}

// Flat rows, where top-p and min-p keep more than the best 1024 tokens (which hold far less than
// the mass asked for): values from a few dozen levels, so most tokens tie (ties go to the lower
// id), -0 beside +0, and some -inf. Draws against the definition, exactly.
TEST(Sampling, TopPOverTheWholeRowMatchesTheDefinition) {
  std::mt19937 rng(17);
  std::vector<float> l(100000);
  struct Case {
    float temperature, top_p, min_p;
  };
  const Case cases[] = {{1.0f, 0.5f, 0.0f},
                        {1.0f, 0.95f, 0.0f},
                        {0.7f, 0.9f, 0.0f},
                        {1.0f, 1.0f, 0.5f},
                        {0.8f, 0.9f, 0.6f}};
  int draws = 0;
  for (int row = 0; row < 3; ++row) {
    for (float& v : l) v = static_cast<float>(static_cast<int>(rng() % 40) - 20) * 0.05f;
    for (size_t i = 0; i < 30000; ++i) l[rng() % l.size()] = (i % 2) ? -0.0f : 0.0f;
    for (size_t i = 0; i < 200; ++i) l[rng() % l.size()] = -INFINITY;
    for (const Case& c : cases) {
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.min_p = c.min_p;
      const Reference want = Define(l, p);
      ASSERT_GT(want.walk.size(), 1024u);
      for (int d = 0; d < 10; ++d, ++draws) {
        p.seed = static_cast<uint64_t>(row * 100 + d);
        ASSERT_EQ(SampleToken(l, p, {}, {}, d).token, DrawFrom(want, UniformAt(p.seed, d)))
            << "row " << row << " top_p " << c.top_p << " min_p " << c.min_p << " draw " << d;
      }
    }
  }
  EXPECT_EQ(draws, 3 * 5 * 10);
}

// The reported alternatives are the best ids by value, ties to the lower id, best first, and
// never a NaN while numbers remain: on rows with many ties (values from a few dozen levels), with
// NaNs and -inf sprinkled in, long enough to take the run-maxima bound and short enough (a few
// runs) to be ordered whole; rows of negative levels with -0 beside +0 and +inf, and rows of -inf
// but a few numbers (the n-th largest run maximum is then -inf); against a stable sort of the row.
TEST(Sampling, AlternativesAreTheBestIdsTiesToTheLowerId) {
  std::mt19937 rng(5);
  for (const size_t vocab : {size_t{100000}, size_t{4103}, size_t{130}, size_t{7}}) {
    for (int row = 0; row < 5; ++row) {
      std::vector<float> l(vocab);
      for (float& v : l) v = static_cast<float>(static_cast<int>(rng() % 40)) * 0.25f;
      for (size_t i = 0; i < vocab / 50; ++i) l[rng() % vocab] = std::nanf("");
      for (size_t i = 0; i < vocab / 50; ++i) l[rng() % vocab] = -INFINITY;
      if (row == 2) {
        for (float& v : l) v = std::nanf("");  // all NaN but a few numbers
        for (int i = 0; i < 3; ++i) l[rng() % vocab] = static_cast<float>(i);
      }
      if (row == 3) {  // negative levels, zeros of both signs, a few +inf
        for (float& v : l) v = static_cast<float>(static_cast<int>(rng() % 9) - 8) * 0.25f;
        for (size_t i = 0; i < vocab / 4; ++i) l[rng() % vocab] = (rng() % 2) ? -0.0f : 0.0f;
        for (int i = 0; i < 3; ++i) l[rng() % vocab] = INFINITY;
      }
      if (row == 4) {
        for (float& v : l) v = -INFINITY;  // all -inf but a few numbers
        for (int i = 0; i < 3; ++i) l[rng() % vocab] = -static_cast<float>(i);
      }
      std::vector<int32_t> want(vocab);
      std::iota(want.begin(), want.end(), 0);
      std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
        if (std::isnan(l[a]) || std::isnan(l[b])) return !std::isnan(l[a]) && std::isnan(l[b]);
        return l[a] > l[b];
      });
      for (const int32_t n : {1, 5, 40, 100}) {
        SamplingParams p;
        p.temperature = 0.0f;
        p.logprobs = n;
        const TokenChoice c = SampleToken(l, p, {}, {}, 0);
        const size_t expect = std::min<size_t>(static_cast<size_t>(n), vocab);
        ASSERT_EQ(c.top.size(), expect) << vocab << " " << n;
        for (size_t k = 0; k < expect; ++k) {
          if (std::isnan(l[want[k]])) {  // past the numbers: any NaN ids, none repeated
            EXPECT_TRUE(std::isnan(l[c.top[k].first])) << vocab << " " << n << " " << k;
          } else {
            EXPECT_EQ(c.top[k].first, want[k])
                << vocab << " row " << row << " n " << n << " k " << k;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kimi::sched
