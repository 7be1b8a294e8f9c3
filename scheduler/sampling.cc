#include "scheduler/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace kimi::sched {
namespace {

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// log softmax of the raw row, in double for the normaliser.
std::vector<float> LogSoftmax(std::span<const float> x) {
  const float mx = *std::max_element(x.begin(), x.end());
  double sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v - mx));
  const double lse = mx + std::log(sum);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i] - lse);
  return out;
}

void ApplyPenalties(std::vector<float>& l, const SamplingParams& p,
                    std::span<const int32_t> prompt, std::span<const int32_t> output) {
  if (p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f) {
    std::vector<char> seen(l.size(), 0);
    for (int32_t t : prompt) seen[t] = 1;
    for (int32_t t : output) seen[t] = 1;
    for (size_t i = 0; i < l.size(); ++i) {
      if (seen[i]) l[i] = l[i] > 0 ? l[i] / p.repetition_penalty : l[i] * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : output) ++counts[t];
    for (const auto& [t, n] : counts) {
      l[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(n);
    }
  }
}

int32_t ArgMax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());  // first wins
}

// Probability of each token under temperature, top-k, min-p and top-p, then the token whose
// cumulative mass first exceeds u. Candidates are ordered by scaled logit (ties: lower id first);
// with no filters the draw walks ids in order, which needs no sort.
int32_t Draw(const std::vector<float>& l, const SamplingParams& p, double u) {
  const size_t V = l.size();
  const double inv_t = 1.0 / p.temperature;
  const float top = *std::max_element(l.begin(), l.end());
  const bool filtered =
      (p.top_k > 0 && static_cast<size_t>(p.top_k) < V) || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!filtered) {
    double total = 0.0;
    std::vector<double> w(V);
    for (size_t i = 0; i < V; ++i) total += w[i] = std::exp((l[i] - top) * inv_t);
    const double target = u * total;
    double acc = 0.0;
    for (size_t i = 0; i < V; ++i) {
      acc += w[i];
      if (target < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(V - 1);
  }
  auto better = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  size_t keep = p.top_k > 0 ? std::min<size_t>(V, static_cast<size_t>(p.top_k)) : V;
  // The normaliser covers every kept token; sorting is needed only as far as the filters look.
  // Try the best 1024 first and sort everything only if top-p needs more mass than they hold.
  size_t sorted = std::min(keep, size_t{1024});
  std::partial_sort(order.begin(), order.begin() + sorted, order.end(), better);
  double total = 0.0;
  if (keep == V) {
    for (size_t i = 0; i < V; ++i) total += std::exp((l[i] - top) * inv_t);
  } else {
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), better);
    sorted = keep;
    for (size_t i = 0; i < keep; ++i) total += std::exp((l[order[i]] - top) * inv_t);
  }
  // Candidate i in sorted order; sorts the rest of the kept tokens the first time it is needed.
  auto prob = [&](size_t i) {
    if (i >= sorted) {
      std::sort(order.begin() + sorted, order.begin() + keep, better);
      sorted = keep;
    }
    return std::exp((l[order[i]] - top) * inv_t) / total;
  };
  size_t n = keep;
  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double mass = 0.0;
    size_t m = 0;
    while (m < keep) {
      mass += prob(m++);
      if (mass >= p.top_p) break;
    }
    n = m;
  }
  if (p.min_p > 0.0f) {  // drop tokens below min_p times the best probability
    const double floor = p.min_p * prob(0);
    size_t m = 1;
    while (m < n && prob(m) >= floor) ++m;
    n = m;
  }
  if (n > sorted) prob(n - 1);
  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) mass += prob(i);
  const double target = u * mass;
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += prob(i);
    if (target < acc) return order[i];
  }
  return order[n - 1];
}

}  // namespace

double UniformAt(uint64_t seed, uint64_t index) {
  const uint64_t h = Mix(Mix(seed ^ 0x9e3779b97f4a7c15ull) + index * 0xd1b54a32d192ed03ull);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

TokenChoice SampleToken(std::span<const float> logits, const SamplingParams& p,
                        std::span<const int32_t> prompt, std::span<const int32_t> output,
                        uint64_t index) {
  TokenChoice choice;
  std::vector<float> l(logits.begin(), logits.end());
  ApplyPenalties(l, p, prompt, output);
  if (p.temperature <= 0.0f) {
    choice.token = ArgMax(l);
  } else {
    choice.token = Draw(l, p, UniformAt(p.seed, index));
  }
  if (p.want_logprobs || p.logprobs > 0) {
    const std::vector<float> lp = LogSoftmax(logits);
    choice.logprob = lp[choice.token];
    if (p.logprobs > 0) {
      std::vector<int32_t> ids(lp.size());
      std::iota(ids.begin(), ids.end(), 0);
      const size_t n = std::min<size_t>(ids.size(), static_cast<size_t>(p.logprobs));
      std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
        return lp[a] > lp[b] || (lp[a] == lp[b] && a < b);
      });
      for (size_t i = 0; i < n; ++i) choice.top.emplace_back(ids[i], lp[ids[i]]);
    }
  }
  return choice;
}

}  // namespace kimi::sched
