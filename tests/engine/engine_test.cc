// Invariances of the forward step: how a sequence is split into steps, and what else shares the
// step, must not change its logits (bitwise where the arithmetic is the same, within fp32 rounding
// where the chunked and recurrent forms differ).
#include "engine/engine.h"

#include <cmath>
#include <algorithm>
#include <random>

#include "gtest/gtest.h"
#include "tests/engine/test_models.h"

namespace kimi {
namespace {

const Model& LoadPreset(const std::string& preset) {
  static std::map<std::string, std::unique_ptr<Model>>* models =
      new std::map<std::string, std::unique_ptr<Model>>;
  auto& m = (*models)[preset];
  if (!m) {
    auto loaded = Model::Load(testing::PresetDir(preset));
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    m = std::move(*loaded);
  }
  return *m;
}

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// Runs sequences together, each split into steps of the given sizes (all sequences advance in
// lockstep while they have tokens left); returns every position's logits per sequence.
class Runner {
 public:
  explicit Runner(const Model& m, int64_t seqs, int64_t max_tokens, EngineOptions options = {})
      : m_(m), options_(options), kda_(m.config(), seqs),
        kv_(m.config(), seqs * ((max_tokens + 15) / 16), 16) {
    const int64_t per = (max_tokens + 15) / 16;
    pages_.resize(seqs);
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t p = 0; p < per; ++p) pages_[s].push_back(static_cast<int32_t>(p * seqs + s));
    }
  }

  std::vector<std::vector<float>> Run(const std::vector<std::vector<int32_t>>& tokens,
                                      const std::vector<std::vector<int64_t>>& splits) {
    const int64_t V = m_.config().vocab;
    std::vector<std::vector<float>> logits(tokens.size());
    std::vector<size_t> next(tokens.size(), 0);
    std::vector<int64_t> pos(tokens.size(), 0);
    for (size_t s = 0; s < tokens.size(); ++s) kda_.Clear(static_cast<int64_t>(s));
    Engine engine(m_, {}, options_);
    EngineState state{&kda_, &kv_};
    for (;;) {
      std::vector<SequenceStep> batch;
      std::vector<size_t> who;
      for (size_t s = 0; s < tokens.size(); ++s) {
        if (next[s] >= splits[s].size()) continue;
        const int64_t n = splits[s][next[s]];
        SequenceStep step;
        step.kda_slot = static_cast<int64_t>(s);
        step.pages = pages_[s];
        step.pos0 = pos[s];
        step.tokens = std::span<const int32_t>(tokens[s].data() + pos[s], n);
        step.logits = LogitsWanted::kAll;
        batch.push_back(step);
        who.push_back(s);
      }
      if (batch.empty()) break;
      StepOutput out;
      const absl::Status st = engine.Step(batch, state, &out);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
      for (size_t i = 0; i < batch.size(); ++i) {
        const size_t s = who[i];
        const int64_t n = static_cast<int64_t>(batch[i].tokens.size());
        const float* rows = out.logits.data() + out.first_row[i] * V;
        logits[s].insert(logits[s].end(), rows, rows + n * V);
        pos[s] += n;
        ++next[s];
      }
    }
    return logits;
  }

 private:
  const Model& m_;
  EngineOptions options_;
  KdaStatePool kda_;
  MlaKvCache kv_;
  std::vector<std::vector<int32_t>> pages_;
};

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return d;
}

// Four requests of lengths 5, 70, 1 and 33, each a prefill of all but its last 3 tokens, then 3
// decodes (the one-token prompt just decodes).
struct MixedRequests {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int64_t>> splits;
  MixedRequests(int64_t vocab, uint32_t seed) {
    const int64_t lengths[] = {5, 70, 1, 33};
    for (int i = 0; i < 4; ++i) {
      tokens.push_back(RandomTokens(lengths[i], vocab, seed + i));
      if (lengths[i] > 3) {
        splits.push_back({lengths[i] - 3, 1, 1, 1});
      } else {
        splits.push_back(std::vector<int64_t>(lengths[i], 1));
      }
    }
  }
};

// The median of |a - b| over the elements.
double MedianDiff(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> diffs;
  for (size_t j = 0; j < a.size() && j < b.size(); ++j) diffs.push_back(std::fabs(a[j] - b[j]));
  std::nth_element(diffs.begin(), diffs.begin() + diffs.size() / 2, diffs.end());
  return diffs[diffs.size() / 2];
}

// A 129-token prompt split on the 64-token grid, or before its last token (its last chunk, whole or
// alone, is the recurrent step, as when a prompt of 64k + 1 tokens fills a step's budget): the
// whole run's logits, bit for bit.
void ExpectGridAndTailSplitsBitExact(const Model& m) {
  const auto tail = RandomTokens(129, m.config().vocab, 4);
  Runner t(m, 1, 129);
  const auto whole = t.Run({tail}, {{129}})[0];
  EXPECT_EQ(t.Run({tail}, {{128, 1}})[0], whole);
  EXPECT_EQ(t.Run({tail}, {{64, 65}})[0], whole);
  EXPECT_EQ(t.Run({tail}, {{64, 64, 1}})[0], whole);
}

// Runs the sequences together and each alone (room for max_tokens positions each): every
// sequence's logits equal, bit for bit. Returns the batch's.
std::vector<std::vector<float>> ExpectBatchEqualsAlone(
    const Model& m, const std::vector<std::vector<int32_t>>& tokens,
    const std::vector<std::vector<int64_t>>& splits, int64_t max_tokens,
    EngineOptions options = {}) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  Runner together(m, n, max_tokens, options);
  const auto batch = together.Run(tokens, splits);
  for (int64_t i = 0; i < n; ++i) {
    Runner alone(m, 1, max_tokens, options);
    EXPECT_EQ(alone.Run({tokens[i]}, {splits[i]})[0], batch[i]) << "sequence " << i;
  }
  return batch;
}

class EngineTest : public ::testing::TestWithParam<std::string> {};

// fp32 activations: chunked and token-by-token KDA and a different MLA query grouping round
// differently; logits are O(1), so 1e-4 absolute is many rounding steps yet far from any bug.
constexpr double kSplitTolerance = 1e-4;

TEST_P(EngineTest, PrefillSplitsAndDecodeAgree) {
  const Model& m = LoadPreset(GetParam());
  const auto tokens = RandomTokens(150, m.config().vocab, 1);
  Runner r(m, 1, 150);
  const auto whole = r.Run({tokens}, {{150}})[0];
  for (std::vector<int64_t> split : {std::vector<int64_t>{1, 149}, {64, 86}, {37, 63, 50},
                                     {100, 1, 1, 48}}) {
    EXPECT_LE(MaxDiff(r.Run({tokens}, {split})[0], whole), kSplitTolerance);
  }
  std::vector<int64_t> ones(150, 1);
  EXPECT_LE(MaxDiff(r.Run({tokens}, {ones})[0], whole), kSplitTolerance);
  // Splits on the 64-token grid repeat the same arithmetic: bit-identical.
  EXPECT_EQ(r.Run({tokens}, {{64, 64, 22}})[0], whole);
  // So does a split that leaves one token past the grid alone.
  ExpectGridAndTailSplitsBitExact(m);
}

// N tokens of prefill then decode equals N+1 tokens of prefill.
TEST_P(EngineTest, PrefillThenDecodeEqualsLongerPrefill) {
  const Model& m = LoadPreset(GetParam());
  const auto tokens = RandomTokens(41, m.config().vocab, 2);
  Runner r(m, 1, 41);
  const auto a = r.Run({tokens}, {{40, 1}})[0];
  const auto b = r.Run({tokens}, {{41}})[0];
  EXPECT_LE(MaxDiff(a, b), kSplitTolerance);
}

// A batch of different-length requests gives each exactly what it gets alone.
TEST_P(EngineTest, BatchEqualsAloneBitwise) {
  const Model& m = LoadPreset(GetParam());
  const auto [tokens, splits] = MixedRequests(m.config().vocab, 10);
  ExpectBatchEqualsAlone(m, tokens, splits, 80);
}

// A rank's matrices copied out of a mapped checkpoint and packed (Model::Options::copy_shard, as
// the server's ranks load) compute what the whole-model huge-page copy does, bit for bit; left in
// the mapping, unpacked, they do too (the kernels' summation order ignores the layout).
TEST_P(EngineTest, ShardCopyAndMappingEqualTheCopyBitwise) {
  const Model& whole = LoadPreset(GetParam());
  std::vector<std::vector<int32_t>> tokens = {RandomTokens(40, whole.config().vocab, 7)};
  const std::vector<std::vector<int64_t>> splits = {{37, 1, 1, 1}};
  Runner want(whole, 1, 48);
  const auto logits = want.Run(tokens, splits);
  for (bool copy_shard : {true, false}) {
    Model::Options o;
    o.memory = WeightMemory::kMap;
    o.copy_shard = copy_shard;
    auto m = Model::Load(testing::PresetDir(GetParam()), o);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->weights().lm_head.packed, copy_shard && whole.weights().lm_head.packed);
    Runner got(**m, 1, 48);
    EXPECT_EQ(got.Run(tokens, splits)[0], logits[0]) << "copy_shard " << copy_shard;
  }
}

// Sequence i of `prompts` prompted with prompts[i] tokens, then three decode steps, together and
// alone: each gets exactly what it gets alone.
void ExpectDecodingSequencesEqualAlone(const Model& m, const std::vector<int64_t>& prompts,
                                       uint32_t seed) {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int64_t>> splits;
  int64_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    tokens.push_back(RandomTokens(prompts[i] + 3, m.config().vocab, seed + i));
    splits.push_back({prompts[i], 1, 1, 1});
    longest = std::max(longest, prompts[i] + 3);
  }
  ExpectBatchEqualsAlone(m, tokens, splits, longest);
}

// Batched decode of many short sequences (the KDA layer's side-by-side section, in shares over the
// threads, and from 16 tokens a step the states prefetched during the projections).
TEST_P(EngineTest, ManyDecodingSequencesEqualAloneBitwise) {
  std::vector<int64_t> prompts;
  for (int i = 0; i < 18; ++i) prompts.push_back(1 + i % 5);
  ExpectDecodingSequencesEqualAlone(LoadPreset(GetParam()), prompts, 40);
}

// The same beside one sequence at a longer context, whose MLA attention has more keys than a
// thread's fair share of the step's: it is attended first, its keys split over the threads, the
// others side by side, longest first.
TEST_P(EngineTest, ManyDecodingSequencesBesideALongOneEqualAloneBitwise) {
  std::vector<int64_t> prompts = {120};
  for (int i = 1; i < 12; ++i) prompts.push_back(1 + i % 4);
  ExpectDecodingSequencesEqualAlone(LoadPreset(GetParam()), prompts, 60);
}

// bf16 activations (the opt-in): still bitwise batch-invariant, and close to the fp32 logits.
// Random tiny models are chaotic under bf16 (an expert choice can flip), so closeness is checked
// on the median position, the batch invariance exactly.
TEST_P(EngineTest, Bf16ActivationsAreBatchInvariantAndClose) {
  if (!cpu::HasBf16DotProduct()) GTEST_SKIP() << "no bf16 dot product on this machine";
  const Model& m = LoadPreset(GetParam());
  const EngineOptions bf16{cpu::ActivationDtype::kBf16};
  const auto [tokens, splits] = MixedRequests(m.config().vocab, 20);
  const auto batch = ExpectBatchEqualsAlone(m, tokens, splits, 80, bf16);
  for (int i = 0; i < 4; ++i) {
    Runner f32(m, 1, 80);
    const auto ref = f32.Run({tokens[i]}, {splits[i]})[0];
    EXPECT_LT(MedianDiff(ref, batch[i]), 0.05) << "sequence " << i;
    EXPECT_NE(ref, batch[i]);  // the opt-in did change the arithmetic
  }
}

// A bf16 KDA state (the opt-in, --kda-state-dtype bf16): half the pool's recurrent bytes; prompt
// splits on the grid and batching give the same bits, as with fp32 (the state is rounded after
// every token and every chunk of the grid, whatever the step holds); and the logits stay close to
// the fp32 state's (median position, as for bf16 activations above: an expert choice can flip in
// a random tiny model).
TEST_P(EngineTest, Bf16KdaStateIsSplitAndBatchInvariantAndClose) {
  const Model& f32 = LoadPreset(GetParam());
  auto loaded = Model::Load(testing::PresetDir(GetParam()));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Model& m = **loaded;
  m.SetKdaStateDtype(KdaStateDtype::kBf16);
  const KdaConfig& kda = m.config().kda;
  const int64_t layers = m.config().StageLayersOf(LayerKind::kKda);
  ASSERT_GT(layers, 0);
  EXPECT_EQ(KdaStatePool::SlotBytes(f32.config()) - KdaStatePool::SlotBytes(m.config()),
            layers * kda.num_heads * kda.head_dim * kda.head_dim * 2);

  ExpectGridAndTailSplitsBitExact(m);

  const auto [tokens, splits] = MixedRequests(m.config().vocab, 30);
  const auto batch = ExpectBatchEqualsAlone(m, tokens, splits, 80);
  for (int i = 0; i < 4; ++i) {
    Runner reference(f32, 1, 80);
    const auto ref = reference.Run({tokens[i]}, {splits[i]})[0];
    EXPECT_LT(MedianDiff(ref, batch[i]), 0.05) << "sequence " << i;
    if (i != 2) {                // (a one-token prompt has no state to round before its logits)
      EXPECT_NE(ref, batch[i]);  // the state's rounding did change the arithmetic
    }
  }
}

TEST_P(EngineTest, LogitsAreFiniteAndSpread) {
  const Model& m = LoadPreset(GetParam());
  const auto tokens = RandomTokens(300, m.config().vocab, 3);
  Runner r(m, 1, 300);
  const auto logits = r.Run({tokens}, {{300}})[0];
  double sum = 0.0, sq = 0.0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(logits.size());
  const double stddev = std::sqrt(sq / n - (sum / n) * (sum / n));
  EXPECT_GT(stddev, 0.1);  // well-conditioned: neither collapsed nor exploding
  EXPECT_LT(stddev, 10.0);
}

TEST_P(EngineTest, BadInputIsAnErrorNotACrash) {
  const Model& m = LoadPreset(GetParam());
  KdaStatePool kda(m.config(), 1);
  MlaKvCache kv(m.config(), 1, 16);
  EngineState state{&kda, &kv};
  Engine engine(m);
  const std::vector<int32_t> page = {0};
  const std::vector<int32_t> bad = {static_cast<int32_t>(m.config().vocab)};
  SequenceStep s{0, page, 0, bad, LogitsWanted::kLast};
  StepOutput out;
  EXPECT_FALSE(engine.Step({&s, 1}, state, &out).ok());
  const std::vector<int32_t> many(20, 1);
  s.tokens = many;  // 20 positions need two pages
  EXPECT_FALSE(engine.Step({&s, 1}, state, &out).ok());
  s.tokens = {};
  EXPECT_FALSE(engine.Step({&s, 1}, state, &out).ok());
  const std::vector<int32_t> one = {1};
  s.tokens = one;
  s.kda_slot = 5;
  EXPECT_FALSE(engine.Step({&s, 1}, state, &out).ok());
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineTest, ::testing::Values("kimi-linear-tiny", "k3-tiny"));

}  // namespace
}  // namespace kimi
